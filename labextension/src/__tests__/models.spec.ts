import {
  IClusterModel,
  ILoadModel,
  cpuText,
  errorMessage,
  formatAmount,
  formatBytes,
  fraction,
  isClusterListModel,
  isClusterModel,
  isConnectCodeModel,
  isLoadModel,
  autoscalerText,
  scalingEventLines,
  isValidAddress,
  originLabel,
  parseScaleForm,
  parseStartForm,
  pickCluster,
  statusText,
  storeText,
  tasksText
} from '../models';

function cluster(overrides: Partial<IClusterModel> = {}): IClusterModel {
  return {
    id: '0123456789ab',
    address: '127.0.0.1:40000',
    origin: 'panel',
    nodes: 1,
    num_cpus: 2,
    session_dir: '/tmp/nbcluster/session_x',
    kernel_id: null,
    owner_pid: 42,
    can_scale: true,
    can_stop: true,
    can_forget: false,
    ...overrides
  };
}

function load(overrides: Partial<ILoadModel> = {}): ILoadModel {
  return {
    cluster_id: '0123456789ab',
    address: '127.0.0.1:40000',
    source: 'head',
    nodes: 1,
    cpu_used: 1,
    cpu_total: 2,
    gpu_used: 0,
    gpu_total: 0,
    store_used: 256 * 1024 * 1024,
    store_capacity: 1024 * 1024 * 1024,
    tasks_running: null,
    tasks_queued: null,
    time: 1700000000,
    autoscaler: null,
    scaling_events: [],
    ...overrides
  };
}

describe('runtime checks of server replies', () => {
  it('accepts a well-formed cluster and list', () => {
    expect(isClusterModel(cluster())).toBe(true);
    expect(isClusterListModel({ clusters: [cluster(), cluster({ id: 'b' })] })).toBe(true);
    expect(isClusterListModel({ clusters: [] })).toBe(true);
  });

  it('rejects clusters with missing or mistyped fields', () => {
    const { can_forget, ...missing } = cluster();
    expect(can_forget).toBe(false);
    expect(isClusterModel(missing)).toBe(false);
    expect(isClusterModel(cluster({ origin: 'elsewhere' as never }))).toBe(false);
    expect(isClusterModel(cluster({ nodes: '2' as never }))).toBe(false);
    expect(isClusterModel(cluster({ nodes: NaN }))).toBe(false);
    expect(isClusterModel(null)).toBe(false);
    expect(isClusterModel([cluster()])).toBe(false);
    expect(isClusterListModel({ clusters: [cluster({ id: 1 as never })] })).toBe(false);
    expect(isClusterListModel([cluster()])).toBe(false);
  });

  it('checks loads and connect codes', () => {
    expect(isLoadModel(load())).toBe(true);
    expect(isLoadModel(load({ source: 'none', cpu_total: null }))).toBe(true);
    expect(isLoadModel(load({ source: 'local' as never }))).toBe(false);
    expect(isLoadModel(load({ cpu_used: 'x' as never }))).toBe(false);
    expect(isLoadModel({ ...load(), time: undefined })).toBe(false);
    const event = { time: 1700000000, kind: 'launch', message: 'launching 1 x cpu2' };
    expect(isLoadModel(load({ autoscaler: 'autoscaler (local): 1 running', scaling_events: [event] }))).toBe(true);
    expect(isLoadModel({ ...load(), scaling_events: undefined })).toBe(false);
    expect(isLoadModel(load({ scaling_events: [{ ...event, time: 'x' as never }] }))).toBe(false);
    expect(isLoadModel(load({ autoscaler: 3 as never }))).toBe(false);
    expect(isConnectCodeModel({ cluster_id: 'a', address: 'b', code: 'c' })).toBe(true);
    expect(isConnectCodeModel({ cluster_id: 'a', address: 'b' })).toBe(false);
  });

  it('takes the error message from the body', () => {
    expect(errorMessage({ message: 'nodes must be from 1 to 16' }, 400)).toBe(
      'nodes must be from 1 to 16'
    );
    expect(errorMessage({ message: '' }, 500)).toBe('the server answered 500');
    expect(errorMessage(null, 403)).toBe('the server answered 403');
  });
});

describe('addresses', () => {
  it.each(['127.0.0.1:6379', 'head.example.org:1', '[::1]:65535', 'h:80'])(
    'accepts %s',
    address => expect(isValidAddress(address)).toBe(true)
  );
  it.each([
    '',
    'localhost',
    '127.0.0.1:0',
    '127.0.0.1:70000',
    'a b:1',
    'host:1\n%system id',
    'host:1; id',
    'http://host:1',
    '-host:1',
    'x'.repeat(400) + ':1'
  ])('rejects %j', address => expect(isValidAddress(address)).toBe(false));
});

describe('formatting', () => {
  it('formats bytes with binary units', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1023)).toBe('1023 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(256 * 1024 * 1024)).toBe('256 MiB');
    expect(formatBytes(7.06 * 1024 ** 3)).toBe('7.06 GiB');
    expect(formatBytes(null)).toBe('–');
    expect(formatBytes(-1)).toBe('–');
  });

  it('formats amounts and fractions', () => {
    expect(formatAmount(2)).toBe('2');
    expect(formatAmount(0.5)).toBe('0.5');
    expect(formatAmount(1 / 3)).toBe('0.33');
    expect(formatAmount(null)).toBe('–');
    expect(fraction(1, 2)).toBe(0.5);
    expect(fraction(3, 2)).toBe(1);
    expect(fraction(1, 0)).toBeNull();
    expect(fraction(null, 2)).toBeNull();
  });

  it('describes CPU and store use', () => {
    expect(cpuText(load())).toBe('1/2');
    expect(cpuText(load({ cpu_used: null }))).toBe('–/2');
    expect(cpuText(null)).toBe('–');
    expect(storeText(load())).toBe('256 MiB / 1 GiB (25%)');
    expect(storeText(load({ store_capacity: null }))).toBe('256 MiB / –');
  });

  it('describes tasks only when the head reports them', () => {
    expect(tasksText(load())).toBeNull();
    expect(tasksText(null)).toBeNull();
    expect(tasksText(load({ tasks_running: 2, tasks_queued: 1 }))).toBe('2 running, 1 queued');
    expect(tasksText(load({ tasks_queued: 3 }))).toBe('– running, 3 queued');
  });

  it('builds the status-bar text', () => {
    expect(statusText(null, false)).toBe('nbcluster: no cluster');
    expect(statusText(null, true)).toBe('nbcluster: load unknown');
    expect(statusText(load({ source: 'none' }), true)).toBe('nbcluster: load unknown');
    expect(statusText(load(), true)).toBe('nbcluster: CPU 1/2 · store 25%');
    expect(statusText(load({ store_capacity: 0 }), true)).toBe('nbcluster: CPU 1/2 · store –');
  });

  it('labels origins', () => {
    expect(originLabel(cluster())).toBe('started here');
    expect(originLabel(cluster({ origin: 'kernel' }))).toBe('started by a kernel');
    expect(originLabel(cluster({ origin: 'host', owner_pid: 7 }))).toBe('process 7');
    expect(originLabel(cluster({ origin: 'host', owner_pid: null }))).toBe('on this host');
    expect(originLabel(cluster({ origin: 'address' }))).toBe('added address');
  });
});

describe('forms', () => {
  it('parses the start form', () => {
    expect(parseStartForm('2', '1')).toEqual({ num_cpus: 2, nodes: 1 });
    expect(parseStartForm(' 4 ', '3')).toEqual({ num_cpus: 4, nodes: 3 });
    expect(parseStartForm('', '1')).toBe('CPUs per node must be a whole number from 1 to 256');
    expect(parseStartForm('1.5', '1')).toBe(
      'CPUs per node must be a whole number from 1 to 256'
    );
    expect(parseStartForm('0', '1')).toBe('CPUs per node must be from 1 to 256');
    expect(parseStartForm('2', '17')).toBe('Nodes must be from 1 to 16');
    expect(parseStartForm('2', '-1')).toBe('Nodes must be a whole number from 1 to 16');
    expect(parseStartForm('8', '2', { maxCpus: 4, maxNodes: 2 })).toBe(
      'CPUs per node must be from 1 to 4'
    );
  });

  it('parses the scale input', () => {
    expect(parseScaleForm('2')).toEqual({ nodes: 2 });
    expect(parseScaleForm('two')).toBe('Nodes must be a whole number from 1 to 16');
    expect(parseScaleForm('0')).toBe('Nodes must be from 1 to 16');
  });
});

describe('pickCluster: the active kernel’s cluster', () => {
  const a = cluster({ id: 'aaaaaaaaaaaa' });
  const b = cluster({ id: 'bbbbbbbbbbbb', origin: 'kernel', kernel_id: 'k1' });
  const c = cluster({ id: 'cccccccccccc', origin: 'host' });

  it('prefers the cluster the kernel started', () => {
    const connected = new Map([['k1', a.id]]);
    expect(pickCluster([a, b, c], 'k1', connected, c.id)).toBe(b);
  });

  it('then the cluster the panel connected the kernel to', () => {
    expect(pickCluster([a, b, c], 'k2', new Map([['k2', c.id]]), a.id)).toBe(c);
  });

  it('then the only cluster, then the last connected one', () => {
    expect(pickCluster([a], 'k9', new Map(), null)).toBe(a);
    expect(pickCluster([a, c], null, new Map(), c.id)).toBe(c);
    expect(pickCluster([a, c], 'k9', new Map([['k9', 'gone']]), a.id)).toBe(a);
  });

  it('returns null when nothing applies', () => {
    expect(pickCluster([], 'k1', new Map(), null)).toBeNull();
    expect(pickCluster([a, c], null, new Map(), null)).toBeNull();
    expect(pickCluster([a, c], null, new Map(), 'gone')).toBeNull();
  });
});

describe('the autoscaler on a cluster card', () => {
  it('shows the summary and the events, newest first', () => {
    expect(autoscalerText(null)).toBeNull();
    expect(autoscalerText(load())).toBeNull();
    const events = [
      { time: new Date(2026, 0, 1, 12, 3, 4).getTime() / 1000, kind: 'launch', message: 'launching 1 x cpu2' },
      { time: new Date(2026, 0, 1, 12, 3, 6).getTime() / 1000, kind: 'joined', message: 'node a joined' }
    ];
    const l = load({ autoscaler: 'autoscaler (local): 1 running', scaling_events: events });
    expect(autoscalerText(l)).toBe('autoscaler (local): 1 running');
    expect(scalingEventLines(l)).toEqual([
      '12:03:06 joined: node a joined',
      '12:03:04 launch: launching 1 x cpu2'
    ]);
    expect(scalingEventLines(null)).toEqual([]);
  });
});
