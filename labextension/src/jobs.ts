/**
 * The Jobs section of the sidebar: the jobs of a cluster with status and duration, a
 * live log view of the selected job, and stop / remove buttons. Values from the server
 * are set as `textContent` (job output is untrusted), never as HTML.
 */

import { Poll } from '@lumino/polling';

import { JobsAPI } from './jobsApi';
import {
  IJobModel,
  durationText,
  failureText,
  isTerminal,
  trimLog
} from './jobsModels';
import { ClusterStore } from './store';

/** What the section needs from the panel it lives in. */
export interface IJobsHost {
  run(action: () => Promise<unknown>): Promise<void>;
  showError(message: string | null): void;
}

const MAX_LOG_CHARS = 200_000;
/** At most this often the list is read because the cluster changed (jobs submitted elsewhere). */
const STORE_REFRESH_MS = 10_000;
/** How often the list is read while a job of it runs (its status and duration move). */
const BUSY_LIST = { interval: 2000, backoff: true, max: 30000 };
/**
 * How often the list is read while no job of it runs: jobs submitted elsewhere (the CLI,
 * the SDK, another page) must show up, and the heads push nothing for a job that uses
 * no resources, so an idle page still reads the list (one small request) this often.
 */
const IDLE_LIST = { interval: 10_000, backoff: true, max: 30000 };

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function button(className: string, label: string, title: string): HTMLButtonElement {
  const b = el('button', `jp-mod-styled nbcluster-button ${className}`, label);
  b.type = 'button';
  b.title = title;
  return b;
}

/** One row of the job list. */
class JobRow {
  readonly node: HTMLDivElement;

  constructor(
    readonly sid: string,
    section: JobsSection
  ) {
    this.node = el('div', 'nbcluster-job');
    this.node.dataset.submissionId = sid;
    this._id = el('span', 'nbcluster-job-id', sid);
    this._status = el('span', 'nbcluster-job-status');
    this._duration = el('span', 'nbcluster-job-duration');
    this._stop = button('nbcluster-job-stop', 'Stop', 'Stop this job (its whole process group)');
    this._stop.addEventListener('click', event => {
      event.stopPropagation();
      void section.stop(sid);
    });
    this._remove = button('nbcluster-job-remove', 'Remove', 'Forget this job and its log');
    this._remove.addEventListener('click', event => {
      event.stopPropagation();
      void section.remove(sid);
    });
    this._reason = el('div', 'nbcluster-job-reason');
    this.node.append(this._id, this._status, this._duration, this._stop, this._remove, this._reason);
    this.node.addEventListener('click', () => section.select(sid));
  }

  update(job: IJobModel, nowMs: number, selected: boolean): void {
    this._status.textContent = job.status;
    this._status.dataset.status = job.status;
    this._duration.textContent = durationText(job, nowMs);
    this.node.title = job.entrypoint;
    const terminal = isTerminal(job.status);
    this._stop.style.display = terminal ? 'none' : '';
    this._remove.style.display = terminal ? '' : 'none';
    const reason = failureText(job);
    this._reason.textContent = reason;
    this._reason.style.display = reason ? '' : 'none';
    this.node.classList.toggle('nbcluster-mod-selected', selected);
  }

  private _id: HTMLElement;
  private _status: HTMLElement;
  private _duration: HTMLElement;
  private _stop: HTMLButtonElement;
  private _remove: HTMLButtonElement;
  private _reason: HTMLElement;
}

/** The Jobs section (`.nbcluster-jobs`). */
export class JobsSection {
  readonly node: HTMLElement;

  constructor(
    private readonly _store: ClusterStore,
    private readonly _host: IJobsHost,
    readonly api: JobsAPI = new JobsAPI()
  ) {
    this.node = el('section', 'nbcluster-jobs');
    const head = el('div', 'nbcluster-jobs-head');
    head.append(el('h3', 'nbcluster-jobs-title', 'Jobs'));
    this._cluster = el('select', 'jp-mod-styled nbcluster-jobs-cluster');
    this._cluster.setAttribute('aria-label', 'cluster');
    this._cluster.addEventListener('change', () => {
      this._jobs = [];
      this.select(null);
      void this.refresh();
    });
    head.append(this._cluster);
    this._empty = el('div', 'nbcluster-empty nbcluster-jobs-empty', '');
    this._list = el('div', 'nbcluster-jobs-list');
    this._detail = el('div', 'nbcluster-job-detail');
    this._detailTitle = el('div', 'nbcluster-job-title');
    this._log = el('pre', 'nbcluster-job-log');
    this._detail.append(this._detailTitle, this._log);
    this._detail.style.display = 'none';
    this.node.append(head, this._empty, this._list, this._detail);

    this._listPoll = new Poll({
      factory: () => this.refresh(),
      frequency: IDLE_LIST,
      // Fast while a job runs, slow while none does (refresh() switches): with none
      // running the list still changes by submissions from elsewhere, which the
      // cluster's pushed updates do not always bring (a job that uses no resources).
      standby: () => document.hidden || this.clusterId === null,
      name: 'nbcluster:jobs'
    });
    this._logPoll = new Poll({
      factory: () => this._readLog(),
      frequency: { interval: 1000, backoff: false },
      standby: 'when-hidden',
      name: 'nbcluster:job-log'
    });
    _store.changed.connect(this._clustersChanged, this);
    this._clustersChanged();
  }

  /** The cluster whose jobs are shown (null when no cluster can be reached). */
  get clusterId(): string | null {
    return this._cluster.value || null;
  }

  /** The submission id of the job whose log is shown. */
  get selected(): string | null {
    return this._selected;
  }

  /** Run a notebook or script (path relative to the server root) as a job; select it. */
  async submit(path: string): Promise<IJobModel> {
    const id = this.clusterId;
    if (id === null) {
      throw new Error('Start a cluster first: jobs run on a cluster of this server.');
    }
    const job = await this.api.submit(id, { path });
    await this.refresh();
    // Follow the new job at the busy pace from now on, not after the idle wait.
    void this._listPoll.schedule({ interval: BUSY_LIST.interval, phase: 'refreshed' });
    this.select(job.submission_id);
    return job;
  }

  /** Stop a job. */
  async stop(sid: string): Promise<void> {
    const id = this.clusterId;
    if (id !== null) {
      await this._host.run(() => this.api.stop(id, sid));
      await this.refresh();
    }
  }

  /** Forget a finished job. */
  async remove(sid: string): Promise<void> {
    const id = this.clusterId;
    if (id !== null) {
      await this._host.run(() => this.api.remove(id, sid));
      if (this._selected === sid) {
        this.select(null);
      }
      await this.refresh();
    }
  }

  /** Show the log of job `sid` (null hides the log view). */
  select(sid: string | null): void {
    if (sid === this._selected) {
      return;
    }
    this._selected = sid;
    this._offset = 0;
    this._logText = '';
    this._logDone = false; // else a finished job's log is never read after another one's
    this._log.textContent = '';
    this._detailTitle.textContent = sid === null ? '' : `Log of ${sid}`;
    this._detail.style.display = sid === null ? 'none' : '';
    this._render();
    if (sid !== null) {
      void this._readLog();
    }
  }

  /** Read the job list now. */
  async refresh(): Promise<void> {
    const id = this.clusterId;
    if (id === null) {
      this._jobs = [];
      this._render();
      return;
    }
    this._lastRefresh = Date.now();
    try {
      this._jobs = await this.api.list(id);
      this._error = null;
    } catch (error) {
      this._error = error instanceof Error ? error.message : String(error);
    }
    // The next reads of the list: fast while a job runs, slow while none does.
    this._listPoll.frequency = this._jobs.some(j => !isTerminal(j.status))
      ? BUSY_LIST
      : IDLE_LIST;
    this._render();
  }

  dispose(): void {
    this._store.changed.disconnect(this._clustersChanged, this);
    this._listPoll.dispose();
    this._logPoll.dispose();
  }

  private async _readLog(): Promise<void> {
    const id = this.clusterId;
    const sid = this._selected;
    if (id === null || sid === null) {
      return;
    }
    const job = this._jobs.find(j => j.submission_id === sid);
    if (job !== undefined && isTerminal(job.status) && this._logDone) {
      return;
    }
    try {
      const part = await this.api.logs(id, sid, this._offset);
      if (sid !== this._selected) {
        return;
      }
      this._offset = part.offset;
      this._logDone = isTerminal(part.status) && part.text === '';
      if (part.text) {
        const atBottom =
          this._log.scrollTop + this._log.clientHeight >= this._log.scrollHeight - 4;
        this._logText = trimLog(this._logText + part.text, MAX_LOG_CHARS);
        this._log.textContent = this._logText;
        if (atBottom) {
          this._log.scrollTop = this._log.scrollHeight;
        }
      }
    } catch (error) {
      this._detailTitle.textContent = `Log of ${sid}: ${
        error instanceof Error ? error.message : String(error)
      }`;
    }
  }

  private _clustersChanged(): void {
    const reachable = this._store.clusters.filter(c => c.session_dir !== null);
    const current = this._cluster.value;
    const ids = reachable.map(c => c.id);
    const existing = Array.from(this._cluster.options).map(o => o.value);
    if (existing.join() !== ids.join()) {
      this._cluster.textContent = '';
      for (const c of reachable) {
        const option = el('option', '', c.address);
        option.value = c.id;
        this._cluster.append(option);
      }
      const keep = ids.includes(current) ? current : ids[0] ?? '';
      this._cluster.value = keep;
      if (keep !== current) {
        this._jobs = [];
        this.select(null);
        void this.refresh();
      }
    } else if (Date.now() - this._lastRefresh > STORE_REFRESH_MS) {
      // The cluster changed (a pushed update): look for jobs submitted elsewhere.
      void this.refresh();
    }
    this._render();
  }

  private _render(): void {
    const now = Date.now();
    for (const [sid, row] of this._rows) {
      if (!this._jobs.some(j => j.submission_id === sid)) {
        row.node.remove();
        this._rows.delete(sid);
      }
    }
    // Newest first.
    [...this._jobs].reverse().forEach((job, index) => {
      let row = this._rows.get(job.submission_id);
      if (row === undefined) {
        row = new JobRow(job.submission_id, this);
        this._rows.set(job.submission_id, row);
      }
      row.update(job, now, job.submission_id === this._selected);
      const at = this._list.children[index] ?? null;
      if (at !== row.node) {
        this._list.insertBefore(row.node, at);
      }
    });
    let empty = '';
    if (this.clusterId === null) {
      empty = 'Jobs run on a cluster of this server: start one above.';
    } else if (this._error !== null) {
      empty = this._error;
    } else if (this._jobs.length === 0) {
      empty = 'No jobs yet. Run “Submit as nbcluster Job” on a notebook or script, or %%job in a cell.';
    }
    this._empty.textContent = empty;
    this._empty.style.display = empty ? '' : 'none';
  }

  private _cluster: HTMLSelectElement;
  private _empty: HTMLElement;
  private _list: HTMLElement;
  private _detail: HTMLElement;
  private _detailTitle: HTMLElement;
  private _log: HTMLElement;
  private _rows = new Map<string, JobRow>();
  private _jobs: IJobModel[] = [];
  private _lastRefresh = 0;
  private _selected: string | null = null;
  private _offset = 0;
  private _logText = '';
  private _logDone = false;
  private _error: string | null = null;
  private _listPoll: Poll;
  private _logPoll: Poll;
}
