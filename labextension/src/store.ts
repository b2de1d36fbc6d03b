/**
 * `ClusterStore`: the clusters and their loads, shared by the sidebar panel and the
 * status-bar item, kept current by one long poll of `GET /nbcluster/api/updates`.
 *
 * The server holds an event subscription to each cluster's head and answers the long
 * poll as soon as something changed (a node's load, a cluster started or stopped), so
 * nothing is asked of the heads while the clusters are idle. `refresh()` reads the list
 * and the loads once, directly (after an action, and when updates are not available).
 */

import { ISignal, Signal } from '@lumino/signaling';

import { APIError, NbclusterAPI } from './api';
import {
  IClusterModel,
  ILoadModel,
  IStartRequest,
  IUpdatesModel,
  pickCluster
} from './models';

/** The fewest milliseconds between two updates when the settings do not say otherwise. */
export const DEFAULT_POLL_INTERVAL = 2000;
/** Seconds the server may hold one long poll before answering unchanged. */
export const LONG_POLL_S = 25;
/** The longest wait before asking again after a failed long poll (ms). */
const MAX_BACKOFF_MS = 30000;

/** The list of clusters, their loads, and which kernel the panel connected to which. */
export class ClusterStore {
  constructor(
    readonly api: NbclusterAPI = new NbclusterAPI(),
    options: { autostart?: boolean } = {}
  ) {
    if (options.autostart ?? true) {
      void this._listen();
    }
  }

  /** Emitted after every update and every change made through the store. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The clusters as of the last update. */
  get clusters(): readonly IClusterModel[] {
    return this._clusters;
  }

  /** The message of the last failed update or action (null when it worked). */
  get error(): string | null {
    return this._error;
  }

  /** The id of the cluster the panel last connected a kernel to. */
  get lastConnected(): string | null {
    return this._lastConnected;
  }

  /** Kernel id → id of the cluster the panel connected it to. */
  get connectedKernels(): ReadonlyMap<string, string> {
    return this._connected;
  }

  /** The version of the last update received from the server (0: none yet). */
  get version(): number {
    return this._version;
  }

  /** The last load read for a cluster (null: unknown or unavailable). */
  load(id: string): ILoadModel | null {
    return this._loads.get(id) ?? null;
  }

  /** The cluster the status bar shows for the kernel `kernelId`. */
  clusterFor(kernelId: string | null): IClusterModel | null {
    return pickCluster(this._clusters, kernelId, this._connected, this._lastConnected);
  }

  /** Change the fewest milliseconds between two updates (at least 500). */
  setInterval(ms: number): void {
    this._interval = Math.max(500, Math.round(ms));
  }

  /** Apply one reply of the updates route (what the long poll does with it). */
  apply(update: IUpdatesModel): void {
    this._version = update.version;
    this._clusters = update.clusters;
    const loads = new Map<string, ILoadModel>();
    for (const load of update.loads) {
      loads.set(load.cluster_id, load);
    }
    this._loads = loads;
    this._error = null;
    this._changed.emit();
  }

  /** Read the list and every cluster's load now (one request each, not the long poll). */
  async refresh(): Promise<void> {
    try {
      const clusters = await this.api.listClusters();
      const loads = await Promise.all(
        clusters.map(c =>
          c.origin === 'address'
            ? Promise.resolve(null)
            : this.api.load(c.id).catch(() => null)
        )
      );
      this._clusters = clusters;
      this._loads = new Map();
      clusters.forEach((c, i) => {
        const load = loads[i];
        if (load !== null) {
          this._loads.set(c.id, load);
        }
      });
      this._error = null;
    } catch (error) {
      this._error = messageOf(error);
    }
    this._changed.emit();
  }

  /** Start a cluster; returns it (the list is refreshed). */
  async start(req: IStartRequest): Promise<IClusterModel> {
    const cluster = await this._act(() => this.api.startCluster(req));
    await this.refresh();
    return cluster;
  }

  /** Scale a cluster started from the panel. */
  async scale(id: string, nodes: number): Promise<void> {
    await this._act(() => this.api.scaleCluster(id, { nodes }));
    await this.refresh();
  }

  /** Stop a cluster started from the panel, or forget an added address. */
  async stop(id: string): Promise<void> {
    await this._act(() => this.api.stopCluster(id));
    for (const [kernel, cluster] of this._connected) {
      if (cluster === id) {
        this._connected.delete(kernel);
      }
    }
    if (this._lastConnected === id) {
      this._lastConnected = null;
    }
    await this.refresh();
  }

  /** The connect cell of a cluster. */
  async connectCode(id: string): Promise<string> {
    return (await this._act(() => this.api.connectCode(id))).code;
  }

  /** Remember that the panel connected `kernelId` (may be null) to the cluster `id`. */
  markConnected(id: string, kernelId: string | null): void {
    if (kernelId !== null) {
      this._connected.set(kernelId, id);
    }
    this._lastConnected = id;
    this._changed.emit();
  }

  /** Stop listening. */
  dispose(): void {
    this._disposed = true;
    Signal.clearData(this);
  }

  /** The long poll: ask, apply, wait at least the interval, ask again. */
  private async _listen(): Promise<void> {
    let backoff = 1000;
    while (!this._disposed) {
      const asked = Date.now();
      try {
        const update = await this.api.updates(this._version, LONG_POLL_S);
        if (this._disposed) {
          return;
        }
        if (update.version !== this._version) {
          this.apply(update);
        }
        backoff = 1000;
        await sleep(Math.max(0, this._interval - (Date.now() - asked)));
      } catch (error) {
        if (this._disposed) {
          return;
        }
        // A server without the updates route (404), or one that went away: read once,
        // then ask again later, backing off.
        if (!(error instanceof APIError) || error.status !== 404) {
          this._error = messageOf(error);
          this._changed.emit();
        }
        await this.refresh();
        await sleep(backoff);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      }
    }
  }

  private async _act<T>(fn: () => Promise<T>): Promise<T> {
    try {
      const result = await fn();
      this._error = null;
      return result;
    } catch (error) {
      this._error = messageOf(error);
      this._changed.emit();
      throw error;
    }
  }

  private _changed = new Signal<this, void>(this);
  private _clusters: IClusterModel[] = [];
  private _loads = new Map<string, ILoadModel>();
  private _error: string | null = null;
  private _connected = new Map<string, string>();
  private _lastConnected: string | null = null;
  private _version = 0;
  private _interval = DEFAULT_POLL_INTERVAL;
  private _disposed = false;
}

function sleep(ms: number): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, ms));
}

function messageOf(error: unknown): string {
  return error instanceof APIError || error instanceof Error ? error.message : String(error);
}
