/**
 * `ClusterStore` against a fake API: the long poll applies each new version once, waits
 * the interval between rounds, and falls back to one-shot reads when it fails.
 */

import { APIError, NbclusterAPI } from '../api';
import { IClusterModel, ILoadModel, IUpdatesModel } from '../models';
import { ClusterStore } from '../store';

function cluster(id: string): IClusterModel {
  return {
    id,
    address: '127.0.0.1:7000',
    origin: 'panel',
    nodes: 1,
    num_cpus: 2,
    session_dir: '/tmp/s',
    kernel_id: null,
    owner_pid: 1,
    can_scale: true,
    can_stop: true,
    can_forget: false
  };
}

function load(id: string, cpuUsed: number): ILoadModel {
  return {
    cluster_id: id,
    address: '127.0.0.1:7000',
    source: 'head',
    nodes: 1,
    cpu_used: cpuUsed,
    cpu_total: 2,
    gpu_used: 0,
    gpu_total: 0,
    store_used: 0,
    store_capacity: 100,
    tasks_running: cpuUsed,
    tasks_queued: 0,
    time: 0,
    autoscaler: null,
    scaling_events: []
  };
}

/** An API whose `updates` answers from a script, then never again. */
class FakeAPI {
  asked: number[] = [];
  lists = 0;
  constructor(private readonly script: (IUpdatesModel | Error)[]) {}

  updates(after: number): Promise<IUpdatesModel> {
    this.asked.push(after);
    const next = this.script.shift();
    if (next === undefined) {
      return new Promise(() => undefined);
    }
    return next instanceof Error ? Promise.reject(next) : Promise.resolve(next);
  }

  listClusters(): Promise<IClusterModel[]> {
    this.lists += 1;
    return Promise.resolve([cluster('bbbbbbbbbbbb')]);
  }

  load(id: string): Promise<ILoadModel> {
    return Promise.resolve(load(id, 0));
  }
}

const flush = (ms = 0): Promise<void> => new Promise(r => setTimeout(r, ms));

describe('ClusterStore', () => {
  it('applies each new version of the long poll and passes it back', async () => {
    const api = new FakeAPI([
      { version: 1, clusters: [cluster('aaaaaaaaaaaa')], loads: [load('aaaaaaaaaaaa', 0)] },
      { version: 1, clusters: [], loads: [] },
      { version: 2, clusters: [cluster('aaaaaaaaaaaa')], loads: [load('aaaaaaaaaaaa', 2)] }
    ]);
    const store = new ClusterStore(api as unknown as NbclusterAPI, { autostart: false });
    store.setInterval(500);
    let changes = 0;
    store.changed.connect(() => (changes += 1));
    void (store as any)._listen();
    await flush(1700);
    expect(api.asked).toEqual([0, 1, 1, 2]);
    expect(store.version).toBe(2);
    expect(store.clusters.map(c => c.id)).toEqual(['aaaaaaaaaaaa']); // version 1 again: ignored
    expect(store.load('aaaaaaaaaaaa')?.cpu_used).toBe(2);
    expect(changes).toBe(2);
    store.dispose();
  });

  it('reads once and backs off when the long poll fails', async () => {
    const api = new FakeAPI([new APIError('the Jupyter server could not be reached', 0)]);
    const store = new ClusterStore(api as unknown as NbclusterAPI, { autostart: false });
    void (store as any)._listen();
    await flush(50);
    expect(api.lists).toBe(1);
    expect(store.clusters.map(c => c.id)).toEqual(['bbbbbbbbbbbb']);
    expect(api.asked).toEqual([0]); // the next try waits for the back-off
    store.dispose();
  });
});
