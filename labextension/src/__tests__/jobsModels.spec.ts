import {
  IJobModel,
  canRunAsJob,
  durationText,
  failureText,
  isJobListModel,
  isJobLogsModel,
  isJobModel,
  isTerminal,
  trimLog
} from '../jobsModels';

function job(overrides: Partial<IJobModel> = {}): IJobModel {
  return {
    submission_id: 'nbcsubmit_0123456789abcdef',
    status: 'RUNNING',
    entrypoint: 'python -m IPython analysis.ipynb',
    message: null,
    error_type: null,
    start_time: 1_000_000,
    end_time: null,
    duration_s: null,
    driver_exit_code: null,
    source: 'jupyterlab',
    ...overrides
  };
}

describe('job models', () => {
  it('accepts well-formed jobs, lists and logs', () => {
    expect(isJobModel(job())).toBe(true);
    expect(isJobListModel({ cluster_id: 'abc', jobs: [job()] })).toBe(true);
    expect(isJobLogsModel({ submission_id: 'x', text: 'hi\n', offset: 3, status: 'RUNNING' })).toBe(
      true
    );
  });

  it('rejects malformed ones', () => {
    expect(isJobModel(job({ status: 'EXPLODED' }))).toBe(false);
    expect(isJobModel({ ...job(), start_time: 'yesterday' })).toBe(false);
    expect(isJobListModel({ cluster_id: 'abc', jobs: [{}] })).toBe(false);
    expect(isJobLogsModel({ submission_id: 'x', text: 'hi', offset: -1, status: 'RUNNING' })).toBe(
      false
    );
    expect(isJobModel(null)).toBe(false);
  });

  it('formats durations while running and once ended', () => {
    expect(durationText(job(), 1_002_500)).toBe('2.5s');
    expect(durationText(job({ end_time: 1_065_000 }), 9_999_999)).toBe('1m 05s');
    expect(durationText(job({ end_time: 1_000_000 + 3_720_000 }), 0)).toBe('1h 02m');
    expect(durationText(job({ start_time: null }), 0)).toBe('–');
  });

  it('knows terminal statuses and failure reasons', () => {
    expect(isTerminal('SUCCEEDED') && isTerminal('FAILED') && isTerminal('STOPPED')).toBe(true);
    expect(isTerminal('RUNNING') || isTerminal('PENDING')).toBe(false);
    const failed = job({ status: 'FAILED', message: 'exit code 3, last logs:\nboom' });
    expect(failureText(failed)).toBe('exit code 3, last logs:');
    expect(failureText(job())).toBe('');
  });

  it('runs notebooks and scripts only, and trims long logs at a line start', () => {
    expect(canRunAsJob('work/a.ipynb') && canRunAsJob('b.py')).toBe(true);
    expect(canRunAsJob('data.csv') || canRunAsJob(null)).toBe(false);
    expect(trimLog('one\ntwo\nthree\n', 8)).toBe('three\n');
    expect(trimLog('short', 10)).toBe('short');
  });
});
