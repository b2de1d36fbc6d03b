/**
 * The JSON of the server extension's job routes and the pure logic of the Jobs section.
 *
 * Every interface mirrors a TypedDict of `nbcluster/jupyter/server/job_models.py` (same
 * name with an `I` prefix, same keys; `tests/unit/test_job_models.py` compares them).
 * No DOM and no network here, so jest tests it directly.
 */

/** One job of a cluster (`JobModel`). */
export interface IJobModel {
  submission_id: string;
  status: string;
  entrypoint: string;
  message: string | null;
  error_type: string | null;
  start_time: number | null;
  end_time: number | null;
  duration_s: number | null;
  driver_exit_code: number | null;
  source: string | null;
}

/** `GET clusters/<id>/jobs` (`JobListModel`). */
export interface IJobListModel {
  cluster_id: string;
  jobs: IJobModel[];
}

/** `GET clusters/<id>/jobs/<sid>/logs?offset=N` (`JobLogsModel`). */
export interface IJobLogsModel {
  submission_id: string;
  text: string;
  offset: number;
  status: string;
}

/** `POST clusters/<id>/jobs` (`SubmitJobRequest`). */
export interface ISubmitJobRequest {
  path: string;
}

/** The statuses a job can have (`JobStatus`). */
export const JOB_STATUSES = ['PENDING', 'RUNNING', 'STOPPED', 'SUCCEEDED', 'FAILED'];

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isNumberOrNull(value: unknown): boolean {
  return value === null || (typeof value === 'number' && Number.isFinite(value));
}

function isStringOrNull(value: unknown): boolean {
  return value === null || typeof value === 'string';
}

/** True for a well-formed `IJobModel`. */
export function isJobModel(value: unknown): value is IJobModel {
  return (
    isObject(value) &&
    typeof value.submission_id === 'string' &&
    typeof value.status === 'string' &&
    JOB_STATUSES.includes(value.status) &&
    typeof value.entrypoint === 'string' &&
    isStringOrNull(value.message) &&
    isStringOrNull(value.error_type) &&
    isNumberOrNull(value.start_time) &&
    isNumberOrNull(value.end_time) &&
    isNumberOrNull(value.duration_s) &&
    isNumberOrNull(value.driver_exit_code) &&
    isStringOrNull(value.source)
  );
}

/** True for a well-formed `IJobListModel`. */
export function isJobListModel(value: unknown): value is IJobListModel {
  return (
    isObject(value) &&
    typeof value.cluster_id === 'string' &&
    Array.isArray(value.jobs) &&
    value.jobs.every(isJobModel)
  );
}

/** True for a well-formed `IJobLogsModel`. */
export function isJobLogsModel(value: unknown): value is IJobLogsModel {
  return (
    isObject(value) &&
    typeof value.submission_id === 'string' &&
    typeof value.text === 'string' &&
    typeof value.offset === 'number' &&
    value.offset >= 0 &&
    typeof value.status === 'string'
  );
}

/** True once a job will not change any more. */
export function isTerminal(status: string): boolean {
  return status === 'SUCCEEDED' || status === 'FAILED' || status === 'STOPPED';
}

/**
 * How long the job has run: from its submission to its end, or to `nowMs` while it
 * runs. `65.2` → `"1m 05s"`; unknown → `"–"`.
 */
export function durationText(job: IJobModel, nowMs: number): string {
  if (job.start_time === null) {
    return '–';
  }
  const end = job.end_time ?? nowMs;
  const seconds = Math.max(0, (end - job.start_time) / 1000);
  if (seconds < 60) {
    return `${seconds.toFixed(1)}s`;
  }
  const minutes = Math.floor(seconds / 60);
  const rest = Math.floor(seconds % 60);
  if (minutes < 60) {
    return `${minutes}m ${String(rest).padStart(2, '0')}s`;
  }
  return `${Math.floor(minutes / 60)}h ${String(minutes % 60).padStart(2, '0')}m`;
}

/** The first line of a failed job's message (the reason), or ''. */
export function failureText(job: IJobModel): string {
  if (job.status !== 'FAILED' || !job.message) {
    return '';
  }
  return job.message.split('\n')[0];
}

/** Where a file is a job: notebooks and Python scripts of the server's tree. */
export function canRunAsJob(path: string | null | undefined): boolean {
  return typeof path === 'string' && (path.endsWith('.ipynb') || path.endsWith('.py'));
}

/** Keep a log view bounded: the last `max` characters, cut at a line start. */
export function trimLog(text: string, max: number): string {
  if (text.length <= max) {
    return text;
  }
  const tail = text.slice(text.length - max);
  const cut = tail.indexOf('\n');
  return cut >= 0 ? tail.slice(cut + 1) : tail;
}
