/**
 * `ClusterStore`: the clusters and their loads, refreshed by one poll, shared by the
 * sidebar panel and the status-bar item.
 */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { APIError, NbclusterAPI } from './api';
import { IClusterModel, ILoadModel, IStartRequest, pickCluster } from './models';

/** Poll interval when the settings do not say otherwise (ms). */
export const DEFAULT_POLL_INTERVAL = 2000;

/** The list of clusters, their loads, and which kernel the panel connected to which. */
export class ClusterStore {
  constructor(readonly api: NbclusterAPI = new NbclusterAPI()) {
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: DEFAULT_POLL_INTERVAL, backoff: true, max: 30000 },
      standby: 'when-hidden',
      name: 'nbcluster:clusters'
    });
  }

  /** Emitted after every refresh and every change made through the store. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The clusters as of the last refresh. */
  get clusters(): readonly IClusterModel[] {
    return this._clusters;
  }

  /** The message of the last failed refresh or action (null when it worked). */
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

  /** The last load read for a cluster (null: unknown or unavailable). */
  load(id: string): ILoadModel | null {
    return this._loads.get(id) ?? null;
  }

  /** The cluster the status bar shows for the kernel `kernelId`. */
  clusterFor(kernelId: string | null): IClusterModel | null {
    return pickCluster(this._clusters, kernelId, this._connected, this._lastConnected);
  }

  /** Change the poll interval (ms, at least 500). */
  setInterval(ms: number): void {
    const interval = Math.max(500, Math.round(ms));
    this._poll.frequency = { ...this._poll.frequency, interval };
  }

  /** Read the list and every cluster's load now. */
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

  /** Stop polling. */
  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
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

  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
  private _clusters: IClusterModel[] = [];
  private _loads = new Map<string, ILoadModel>();
  private _error: string | null = null;
  private _connected = new Map<string, string>();
  private _lastConnected: string | null = null;
}

function messageOf(error: unknown): string {
  return error instanceof APIError || error instanceof Error ? error.message : String(error);
}
