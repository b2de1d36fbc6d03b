/**
 * The REST client of the job routes (`/nbcluster/api/clusters/<id>/jobs...`), through
 * `ServerConnection` (token and XSRF header added, like every other call).
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { APIError } from './api';
import { errorMessage } from './models';
import {
  IJobLogsModel,
  IJobModel,
  ISubmitJobRequest,
  isJobListModel,
  isJobLogsModel,
  isJobModel
} from './jobsModels';

/** Typed calls to the job routes. */
export class JobsAPI {
  constructor(
    readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  /** The cluster's submitted jobs, oldest first. */
  async list(clusterId: string): Promise<IJobModel[]> {
    const body = await this._request(jobsPath(clusterId), 'GET');
    if (!isJobListModel(body)) {
      throw new APIError('the server sent an unexpected job list', 200);
    }
    return body.jobs;
  }

  /** Run a notebook or script of the server's tree as a job. */
  async submit(clusterId: string, req: ISubmitJobRequest): Promise<IJobModel> {
    return checkJob(await this._request(jobsPath(clusterId), 'POST', req));
  }

  /** Stop a job (its whole process group). */
  async stop(clusterId: string, sid: string): Promise<IJobModel> {
    return checkJob(await this._request(`${jobPath(clusterId, sid)}/stop`, 'POST', {}));
  }

  /** Forget a finished job and its log. */
  async remove(clusterId: string, sid: string): Promise<void> {
    await this._request(jobPath(clusterId, sid), 'DELETE');
  }

  /** The job's log from byte `offset` on. */
  async logs(clusterId: string, sid: string, offset: number): Promise<IJobLogsModel> {
    const path = `${jobPath(clusterId, sid)}/logs?offset=${Math.max(0, Math.floor(offset))}`;
    const body = await this._request(path, 'GET');
    if (!isJobLogsModel(body)) {
      throw new APIError('the server sent an unexpected log', 200);
    }
    return body;
  }

  private async _request(path: string, method: string, body?: unknown): Promise<unknown> {
    const url = URLExt.join(this.settings.baseUrl, 'nbcluster', 'api', path);
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new APIError(`the Jupyter server could not be reached: ${String(error)}`, 0);
    }
    const text = await response.text();
    let data: unknown = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (!response.ok) {
      throw new APIError(errorMessage(data, response.status), response.status);
    }
    return data;
  }
}

function jobsPath(clusterId: string): string {
  return `clusters/${encodeURIComponent(clusterId)}/jobs`;
}

function jobPath(clusterId: string, sid: string): string {
  return `${jobsPath(clusterId)}/${encodeURIComponent(sid)}`;
}

function checkJob(body: unknown): IJobModel {
  if (!isJobModel(body)) {
    throw new APIError('the server sent an unexpected job', 200);
  }
  return body;
}
