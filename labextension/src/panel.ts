/**
 * The left-sidebar panel: a start form and one card per cluster.
 *
 * Cards are built once per cluster and then only their text is updated, so polling does
 * not steal the focus from an input. Every value from the server is set as
 * `textContent`, never as HTML.
 */

import { Widget } from '@lumino/widgets';

import {
  IClusterModel,
  ILoadModel,
  autoscalerText,
  cpuText,
  formatAmount,
  fraction,
  originLabel,
  parseScaleForm,
  parseStartForm,
  scalingEventLines,
  storeText,
  tasksText
} from './models';
import { JobsSection } from './jobs';
import { ClusterStore } from './store';

/** What the panel asks the application to do. */
export interface IPanelActions {
  /** Insert the connect cell of cluster `id` into the active notebook and run it. */
  insertConnectCode(id: string): Promise<void>;
}

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

function numberInput(className: string, value: string, label: string): HTMLInputElement {
  const input = el('input', `jp-mod-styled nbcluster-input ${className}`);
  input.type = 'number';
  input.min = '1';
  input.step = '1';
  input.value = value;
  input.setAttribute('aria-label', label);
  return input;
}

/** One cluster's card. */
class ClusterCard {
  readonly node: HTMLDivElement;

  constructor(
    cluster: IClusterModel,
    private readonly _panel: ClusterPanel
  ) {
    this.id = cluster.id;
    this.node = el('div', 'nbcluster-card');
    this.node.dataset.clusterId = cluster.id;

    const head = el('div', 'nbcluster-card-head');
    this._address = el('span', 'nbcluster-address');
    this._origin = el('span', 'nbcluster-origin');
    head.append(this._address, this._origin);

    const stats = el('dl', 'nbcluster-stats');
    this._nodes = this._stat(stats, 'Nodes', 'nbcluster-nodes');
    this._cpu = this._stat(stats, 'CPU', 'nbcluster-cpu');
    this._store = this._stat(stats, 'Store', 'nbcluster-store');
    this._tasks = this._stat(stats, 'Tasks', 'nbcluster-tasks');
    this._tasksLabel = this._tasks.previousElementSibling as HTMLElement;
    this._autoscaler = this._stat(stats, 'Autoscaler', 'nbcluster-autoscaler');
    this._autoscalerLabel = this._autoscaler.previousElementSibling as HTMLElement;
    this._events = el('ul', 'nbcluster-scaling-events');
    this._cpuBar = el('div', 'nbcluster-bar-fill');
    const bar = el('div', 'nbcluster-bar');
    bar.append(this._cpuBar);

    const actions = el('div', 'nbcluster-card-actions');
    const connect = button(
      'nbcluster-connect',
      'Insert connect code',
      'Insert a cell that attaches the active notebook’s kernel to this cluster, and run it'
    );
    connect.addEventListener('click', () => {
      void this._panel.run(() => this._panel.actions.insertConnectCode(this.id));
    });
    actions.append(connect);

    this._scaleBox = el('span', 'nbcluster-scale');
    this._scaleInput = numberInput('nbcluster-scale-input', '', 'nodes');
    const scale = button('nbcluster-scale-button', 'Scale', 'Set the number of nodes');
    scale.addEventListener('click', () => {
      const req = parseScaleForm(this._scaleInput.value);
      if (typeof req === 'string') {
        this._panel.showError(req);
        return;
      }
      void this._panel.run(() => this._panel.store.scale(this.id, req.nodes));
    });
    this._scaleBox.append(this._scaleInput, scale);
    actions.append(this._scaleBox);

    this._stop = button('nbcluster-stop', 'Stop', 'Stop this cluster');
    this._stop.addEventListener('click', () => {
      void this._panel.run(() => this._panel.store.stop(this.id));
    });
    actions.append(this._stop);

    this.node.append(head, stats, bar, this._events, actions);
    this.update(cluster, null);
  }

  readonly id: string;

  /** Show the latest model and load. */
  update(cluster: IClusterModel, load: ILoadModel | null): void {
    this._address.textContent = cluster.address;
    this._origin.textContent = originLabel(cluster);
    this._nodes.textContent = formatAmount(load?.nodes ?? cluster.nodes);
    this._cpu.textContent = cpuText(load);
    this._store.textContent = storeText(load);
    const tasks = tasksText(load);
    this._tasks.textContent = tasks ?? '';
    this._tasks.style.display = tasks === null ? 'none' : '';
    this._tasksLabel.style.display = tasks === null ? 'none' : '';
    const scaling = autoscalerText(load);
    this._autoscaler.textContent = scaling ?? '';
    this._autoscaler.style.display = scaling === null ? 'none' : '';
    this._autoscalerLabel.style.display = scaling === null ? 'none' : '';
    this._events.replaceChildren(
      ...scalingEventLines(load).map(line => el('li', 'nbcluster-scaling-event', line))
    );
    const f = load === null ? null : fraction(load.cpu_used, load.cpu_total);
    this._cpuBar.style.width = `${Math.round((f ?? 0) * 100)}%`;
    this._scaleBox.style.display = cluster.can_scale ? '' : 'none';
    if (cluster.can_scale && document.activeElement !== this._scaleInput) {
      this._scaleInput.value = String(cluster.nodes ?? 1);
    }
    this._stop.style.display = cluster.can_stop || cluster.can_forget ? '' : 'none';
    this._stop.textContent = cluster.can_forget ? 'Remove' : 'Stop';
  }

  private _stat(list: HTMLElement, label: string, className: string): HTMLElement {
    const value = el('dd', className, '–');
    list.append(el('dt', '', label), value);
    return value;
  }

  private _address: HTMLElement;
  private _origin: HTMLElement;
  private _nodes: HTMLElement;
  private _cpu: HTMLElement;
  private _store: HTMLElement;
  private _tasks: HTMLElement;
  private _tasksLabel: HTMLElement;
  private _autoscaler: HTMLElement;
  private _autoscalerLabel: HTMLElement;
  private _events: HTMLUListElement;
  private _cpuBar: HTMLElement;
  private _scaleBox: HTMLElement;
  private _scaleInput: HTMLInputElement;
  private _stop: HTMLButtonElement;
}

/** The sidebar panel (`#nbcluster-panel`). */
export class ClusterPanel extends Widget {
  constructor(
    readonly store: ClusterStore,
    readonly actions: IPanelActions
  ) {
    super();
    this.id = 'nbcluster-panel';
    this.addClass('nbcluster-panel');
    this.title.caption = 'nbcluster clusters';

    const root = this.node;
    root.append(el('h2', 'nbcluster-title', 'nbcluster'));

    const form = el('form', 'nbcluster-start');
    this._cpus = numberInput('nbcluster-start-cpus', '2', 'CPUs per node');
    this._nodes = numberInput('nbcluster-start-nodes', '1', 'nodes');
    this._startButton = button('nbcluster-start-button', 'Start', 'Start a local cluster');
    this._startButton.type = 'submit';
    const cpusLabel = el('label', 'nbcluster-label', 'CPUs ');
    cpusLabel.append(this._cpus);
    const nodesLabel = el('label', 'nbcluster-label', 'Nodes ');
    nodesLabel.append(this._nodes);
    form.append(cpusLabel, nodesLabel, this._startButton);
    form.addEventListener('submit', event => {
      event.preventDefault();
      void this.startFromForm();
    });
    root.append(form);

    this._error = el('div', 'nbcluster-error');
    this._error.setAttribute('role', 'alert');
    this._empty = el(
      'div',
      'nbcluster-empty',
      'No clusters. Start one above, or run %cluster start in a notebook.'
    );
    this._list = el('div', 'nbcluster-cards');
    root.append(this._error, this._empty, this._list);
    this.jobs = new JobsSection(store, this); // the Jobs section (issue 17)
    root.append(this.jobs.node);

    store.changed.connect(this._render, this);
    this._render();
  }

  /** Start a cluster with the form's values. */
  async startFromForm(): Promise<void> {
    const req = parseStartForm(this._cpus.value, this._nodes.value);
    if (typeof req === 'string') {
      this.showError(req);
      return;
    }
    this._startButton.disabled = true;
    this._startButton.textContent = 'Starting…';
    try {
      await this.run(() => this.store.start(req));
    } finally {
      this._startButton.disabled = false;
      this._startButton.textContent = 'Start';
    }
  }

  /** Run an action; show its error in the panel instead of throwing. */
  async run(action: () => Promise<unknown>): Promise<void> {
    try {
      this.showError(null);
      this._showingStoreError = false;
      await action();
    } catch (error) {
      this.showError(error instanceof Error ? error.message : String(error));
    }
  }

  /** Show (or clear, with null) a message at the top of the panel. */
  showError(message: string | null): void {
    this._error.textContent = message ?? '';
    this._error.style.display = message ? '' : 'none';
  }

  /** The Jobs section below the clusters. */
  readonly jobs: JobsSection;

  dispose(): void {
    this.jobs.dispose();
    this.store.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const clusters = this.store.clusters;
    for (const [id, card] of this._cards) {
      if (!clusters.some(c => c.id === id)) {
        card.node.remove();
        this._cards.delete(id);
      }
    }
    clusters.forEach((cluster, index) => {
      let card = this._cards.get(cluster.id);
      if (card === undefined) {
        card = new ClusterCard(cluster, this);
        this._cards.set(cluster.id, card);
      }
      card.update(cluster, this.store.load(cluster.id));
      const at = this._list.children[index] ?? null;
      if (at !== card.node) {
        this._list.insertBefore(card.node, at); // the server's order, moving only if needed
      }
    });
    this._empty.style.display = clusters.length ? 'none' : '';
    if (this.store.error) {
      this.showError(this.store.error);
      this._showingStoreError = true;
    } else if (this._showingStoreError) {
      this.showError(null);
      this._showingStoreError = false;
    }
  }

  private _cpus: HTMLInputElement;
  private _nodes: HTMLInputElement;
  private _startButton: HTMLButtonElement;
  private _error: HTMLElement;
  private _empty: HTMLElement;
  private _list: HTMLElement;
  private _cards = new Map<string, ClusterCard>();
  private _showingStoreError = false;
}
