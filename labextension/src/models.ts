/**
 * The JSON of the nbcluster server extension, and the pure logic the UI builds on it.
 *
 * Every interface mirrors a TypedDict of `nbcluster/jupyter/server/models.py` (same name
 * with an `I` prefix, same keys; `tests/unit/test_server_models.py` compares them).
 * Nothing in this module touches the DOM or the network, so jest tests it directly.
 */

/** Where a cluster in the list comes from (`Origin` in models.py). */
export type Origin = 'panel' | 'kernel' | 'host' | 'address';

/** One cluster in the sidebar (`ClusterModel`). */
export interface IClusterModel {
  id: string;
  address: string;
  origin: Origin;
  nodes: number | null;
  num_cpus: number | null;
  session_dir: string | null;
  kernel_id: string | null;
  owner_pid: number | null;
  can_scale: boolean;
  can_stop: boolean;
  can_forget: boolean;
}

/** `GET /nbcluster/api/clusters` (`ClusterListModel`). */
export interface IClusterListModel {
  clusters: IClusterModel[];
}

/** `GET /nbcluster/api/clusters/<id>/load` (`LoadModel`). */
export interface ILoadModel {
  cluster_id: string;
  address: string;
  source: 'head' | 'none';
  nodes: number | null;
  cpu_used: number | null;
  cpu_total: number | null;
  gpu_used: number | null;
  gpu_total: number | null;
  store_used: number | null;
  store_capacity: number | null;
  tasks_running: number | null;
  tasks_queued: number | null;
  time: number;
  autoscaler: string | null;
  scaling_events: IScalingEventModel[];
}

/** One autoscaler event in a load reply (`ScalingEventModel`). */
export interface IScalingEventModel {
  time: number;
  kind: string;
  message: string;
}

/** `GET /nbcluster/api/updates?after=N` (`UpdatesModel`): the list and the loads. */
export interface IUpdatesModel {
  version: number;
  clusters: IClusterModel[];
  loads: ILoadModel[];
}

/** `POST /nbcluster/api/clusters/<id>/connect-code` (`ConnectCodeModel`). */
export interface IConnectCodeModel {
  cluster_id: string;
  address: string;
  code: string;
}

/** The body of every error response (`ErrorModel`). */
export interface IErrorModel {
  message: string;
}

/** `POST /nbcluster/api/clusters` (`StartRequest`). */
export interface IStartRequest {
  num_cpus: number;
  nodes: number;
}

/** `PATCH /nbcluster/api/clusters/<id>` (`ScaleRequest`). */
export interface IScaleRequest {
  nodes: number;
}

/** `POST /nbcluster/api/addresses` (`AddressRequest`). */
export interface IAddressRequest {
  address: string;
}

/** Bounds the server enforces by default (`Limits` in models.py). */
export const DEFAULT_LIMITS = { maxCpus: 256, maxNodes: 16 };

/** `ADDRESS_RE` of models.py: host name, IPv4, or bracketed IPv6, then a port. */
const ADDRESS_RE =
  /^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$/;

/** True for `host:port` with a port from 1 to 65535 (same rule as the server). */
export function isValidAddress(text: string): boolean {
  if (text.length > 300 || !ADDRESS_RE.test(text)) {
    return false;
  }
  const port = Number(text.slice(text.lastIndexOf(':') + 1));
  return port >= 1 && port <= 65535;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isNumOrNull(value: unknown): boolean {
  return value === null || (typeof value === 'number' && Number.isFinite(value));
}

function isStrOrNull(value: unknown): boolean {
  return value === null || typeof value === 'string';
}

const ORIGINS: readonly Origin[] = ['panel', 'kernel', 'host', 'address'];

/** Runtime check of a server reply against `IClusterModel`. */
export function isClusterModel(value: unknown): value is IClusterModel {
  return (
    isObject(value) &&
    typeof value.id === 'string' &&
    typeof value.address === 'string' &&
    ORIGINS.includes(value.origin as Origin) &&
    isNumOrNull(value.nodes) &&
    isNumOrNull(value.num_cpus) &&
    isStrOrNull(value.session_dir) &&
    isStrOrNull(value.kernel_id) &&
    isNumOrNull(value.owner_pid) &&
    typeof value.can_scale === 'boolean' &&
    typeof value.can_stop === 'boolean' &&
    typeof value.can_forget === 'boolean'
  );
}

/** Runtime check of a server reply against `IClusterListModel`. */
export function isClusterListModel(value: unknown): value is IClusterListModel {
  return (
    isObject(value) &&
    Array.isArray(value.clusters) &&
    value.clusters.every(isClusterModel)
  );
}

const LOAD_NUMBERS: readonly (keyof ILoadModel)[] = [
  'nodes',
  'cpu_used',
  'cpu_total',
  'gpu_used',
  'gpu_total',
  'store_used',
  'store_capacity',
  'tasks_running',
  'tasks_queued'
];

/** Runtime check of one entry of `ILoadModel.scaling_events`. */
export function isScalingEventModel(value: unknown): value is IScalingEventModel {
  return (
    isObject(value) &&
    typeof value.time === 'number' &&
    typeof value.kind === 'string' &&
    typeof value.message === 'string'
  );
}

/** Runtime check of a server reply against `ILoadModel`. */
export function isLoadModel(value: unknown): value is ILoadModel {
  return (
    isObject(value) &&
    typeof value.cluster_id === 'string' &&
    typeof value.address === 'string' &&
    (value.source === 'head' || value.source === 'none') &&
    typeof value.time === 'number' &&
    LOAD_NUMBERS.every(key => isNumOrNull(value[key])) &&
    isStrOrNull(value.autoscaler) &&
    Array.isArray(value.scaling_events) &&
    value.scaling_events.every(isScalingEventModel)
  );
}

/** Runtime check of a server reply against `IUpdatesModel`. */
export function isUpdatesModel(value: unknown): value is IUpdatesModel {
  return (
    isObject(value) &&
    typeof value.version === 'number' &&
    Array.isArray(value.clusters) &&
    value.clusters.every(isClusterModel) &&
    Array.isArray(value.loads) &&
    value.loads.every(isLoadModel)
  );
}

/** The autoscaler line of a cluster card, or null when the cluster has no autoscaler. */
export function autoscalerText(load: ILoadModel | null): string | null {
  return load === null ? null : load.autoscaler;
}

/** The card's recent scaling events, newest first: `"12:03:04 launch: launching 1 x cpu2"`. */
export function scalingEventLines(load: ILoadModel | null): string[] {
  if (load === null) {
    return [];
  }
  return [...load.scaling_events].reverse().map(e => {
    const t = new Date(e.time * 1000);
    const pad = (n: number): string => String(n).padStart(2, '0');
    const stamp = `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
    return `${stamp} ${e.kind}: ${e.message}`;
  });
}

/** Runtime check of a server reply against `IConnectCodeModel`. */
export function isConnectCodeModel(value: unknown): value is IConnectCodeModel {
  return (
    isObject(value) &&
    typeof value.cluster_id === 'string' &&
    typeof value.address === 'string' &&
    typeof value.code === 'string'
  );
}

/** The `message` of an error body, or a fallback naming the HTTP status. */
export function errorMessage(body: unknown, status: number): string {
  if (isObject(body) && typeof body.message === 'string' && body.message) {
    return body.message;
  }
  return `the server answered ${status}`;
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** `1536` → `"1.5 KiB"`; null → `"–"`. */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || !Number.isFinite(bytes) || bytes < 0) {
    return '–';
  }
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${Number(value.toFixed(digits))} ${UNITS[unit]}`;
}

/** `2` → `"2"`, `0.5` → `"0.5"`, null → `"–"`. */
export function formatAmount(value: number | null): string {
  if (value === null || !Number.isFinite(value)) {
    return '–';
  }
  return Number.isInteger(value) ? String(value) : String(Math.round(value * 100) / 100);
}

/** Fraction in [0, 1], or null when either number is unknown (or the total is 0). */
export function fraction(used: number | null, total: number | null): number | null {
  if (used === null || total === null || !(total > 0)) {
    return null;
  }
  return Math.min(1, Math.max(0, used / total));
}

/** `"1/2"`: CPUs in use out of the total. */
export function cpuText(load: ILoadModel | null): string {
  if (load === null) {
    return '–';
  }
  return `${formatAmount(load.cpu_used)}/${formatAmount(load.cpu_total)}`;
}

/** `"12 MiB / 1 GiB (1%)"`: object store use. */
export function storeText(load: ILoadModel | null): string {
  if (load === null) {
    return '–';
  }
  const f = fraction(load.store_used, load.store_capacity);
  const pct = f === null ? '' : ` (${Math.round(f * 100)}%)`;
  return `${formatBytes(load.store_used)} / ${formatBytes(load.store_capacity)}${pct}`;
}

/** `"2 running, 1 queued"`, or null when the head reports neither. */
export function tasksText(load: ILoadModel | null): string | null {
  if (load === null || (load.tasks_running === null && load.tasks_queued === null)) {
    return null;
  }
  return `${formatAmount(load.tasks_running)} running, ${formatAmount(load.tasks_queued)} queued`;
}

/** The status-bar text for the active kernel's cluster (null: no cluster). */
export function statusText(load: ILoadModel | null, hasCluster: boolean): string {
  if (!hasCluster) {
    return 'nbcluster: no cluster';
  }
  if (load === null || load.source === 'none') {
    return 'nbcluster: load unknown';
  }
  const f = fraction(load.store_used, load.store_capacity);
  const store = f === null ? '–' : `${Math.round(f * 100)}%`;
  return `nbcluster: CPU ${cpuText(load)} · store ${store}`;
}

function parseWhole(text: string, name: string, high: number): number | string {
  const trimmed = text.trim();
  if (!/^[0-9]+$/.test(trimmed)) {
    return `${name} must be a whole number from 1 to ${high}`;
  }
  const value = Number(trimmed);
  if (value < 1 || value > high) {
    return `${name} must be from 1 to ${high}`;
  }
  return value;
}

/** The start form's values as a request, or the message to show instead. */
export function parseStartForm(
  cpus: string,
  nodes: string,
  limits = DEFAULT_LIMITS
): IStartRequest | string {
  const c = parseWhole(cpus, 'CPUs per node', limits.maxCpus);
  if (typeof c === 'string') {
    return c;
  }
  const n = parseWhole(nodes, 'Nodes', limits.maxNodes);
  if (typeof n === 'string') {
    return n;
  }
  return { num_cpus: c, nodes: n };
}

/** The scale input as a request, or the message to show instead. */
export function parseScaleForm(
  nodes: string,
  limits = DEFAULT_LIMITS
): IScaleRequest | string {
  const n = parseWhole(nodes, 'Nodes', limits.maxNodes);
  return typeof n === 'string' ? n : { nodes: n };
}

/**
 * The cluster the status bar shows for the active kernel: the one that kernel started,
 * else the one the panel connected it to, else the only cluster, else the last one the
 * panel connected anywhere. Null when none applies.
 */
export function pickCluster(
  clusters: readonly IClusterModel[],
  kernelId: string | null,
  connected: ReadonlyMap<string, string>,
  lastConnected: string | null
): IClusterModel | null {
  const byId = (id: string | null | undefined): IClusterModel | null =>
    clusters.find(c => c.id === id) ?? null;
  if (kernelId !== null) {
    const started = clusters.find(c => c.kernel_id === kernelId);
    if (started) {
      return started;
    }
    const joined = byId(connected.get(kernelId));
    if (joined) {
      return joined;
    }
  }
  if (clusters.length === 1) {
    return clusters[0];
  }
  return byId(lastConnected);
}

/** A short label for a card's origin badge. */
export function originLabel(cluster: IClusterModel): string {
  switch (cluster.origin) {
    case 'panel':
      return 'started here';
    case 'kernel':
      return 'started by a kernel';
    case 'host':
      return cluster.owner_pid !== null ? `process ${cluster.owner_pid}` : 'on this host';
    case 'address':
      return 'added address';
  }
}
