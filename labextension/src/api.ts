/**
 * The REST client of `/nbcluster/api/`. Requests go through `ServerConnection`, which
 * adds the server token and the XSRF header, so they pass jupyter_server's checks.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  IAddressRequest,
  IClusterModel,
  IConnectCodeModel,
  ILoadModel,
  IScaleRequest,
  IStartRequest,
  IUpdatesModel,
  errorMessage,
  isClusterListModel,
  isClusterModel,
  isConnectCodeModel,
  isLoadModel,
  isUpdatesModel
} from './models';

/** A failed request: `status` is the HTTP status (0 when the server was not reached). */
export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

/** Typed calls to the nbcluster server extension. */
export class NbclusterAPI {
  constructor(
    readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  /** Every cluster the server knows. */
  async listClusters(): Promise<IClusterModel[]> {
    const body = await this._request('clusters', 'GET');
    return check(body, isClusterListModel, 'cluster list').clusters;
  }

  /** Start a cluster from the panel. */
  async startCluster(req: IStartRequest): Promise<IClusterModel> {
    return check(await this._request('clusters', 'POST', req), isClusterModel, 'cluster');
  }

  /** Scale a cluster started from the panel. */
  async scaleCluster(id: string, req: IScaleRequest): Promise<IClusterModel> {
    const body = await this._request(clusterPath(id), 'PATCH', req);
    return check(body, isClusterModel, 'cluster');
  }

  /** Stop a cluster started from the panel, or forget an added address. */
  async stopCluster(id: string): Promise<void> {
    await this._request(clusterPath(id), 'DELETE');
  }

  /** The cell that attaches a kernel to the cluster. */
  async connectCode(id: string): Promise<IConnectCodeModel> {
    const body = await this._request(`${clusterPath(id)}/connect-code`, 'POST', {});
    return check(body, isConnectCodeModel, 'connect code');
  }

  /** The cluster's load right now. */
  async load(id: string): Promise<ILoadModel> {
    return check(await this._request(`${clusterPath(id)}/load`, 'GET'), isLoadModel, 'load');
  }

  /**
   * The list and the loads once they changed after version `after` (a long poll: the
   * server answers when a head pushes a change, or after `timeout` seconds unchanged).
   */
  async updates(after: number, timeout: number): Promise<IUpdatesModel> {
    const query = `updates?after=${Math.max(0, Math.floor(after))}&timeout=${timeout}`;
    return check(await this._request(query, 'GET'), isUpdatesModel, 'update');
  }

  /** Add a cluster by the address of its head. */
  async addAddress(req: IAddressRequest): Promise<IClusterModel> {
    return check(await this._request('addresses', 'POST', req), isClusterModel, 'cluster');
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

function clusterPath(id: string): string {
  return `clusters/${encodeURIComponent(id)}`;
}

function check<T>(body: unknown, guard: (value: unknown) => value is T, what: string): T {
  if (!guard(body)) {
    throw new APIError(`the server sent an unexpected ${what}`, 200);
  }
  return body;
}
