/**
 * The status-bar item (`#nbcluster-statusbar`): CPU use and object-store fill of the
 * active kernel's cluster (see `pickCluster` for which cluster that is).
 */

import { Widget } from '@lumino/widgets';

import { statusText } from './models';
import { ClusterStore } from './store';

/** A one-line status item; `kernelId()` names the active notebook's kernel. */
export class ClusterStatusItem extends Widget {
  constructor(
    private readonly _store: ClusterStore,
    private readonly _kernelId: () => string | null,
    onClick: () => void
  ) {
    super();
    this.id = 'nbcluster-statusbar';
    this.addClass('nbcluster-statusbar');
    this.node.title = 'nbcluster: the active kernel’s cluster (click to show the clusters)';
    this.node.addEventListener('click', onClick);
    _store.changed.connect(this.refresh, this);
    this.refresh();
  }

  /** Recompute the text (also called when the active notebook changes). */
  refresh(): void {
    const cluster = this._store.clusterFor(this._kernelId());
    const load = cluster === null ? null : this._store.load(cluster.id);
    this.node.textContent = statusText(load, cluster !== null);
    this.node.dataset.clusterId = cluster?.id ?? '';
  }

  dispose(): void {
    this._store.changed.disconnect(this.refresh, this);
    super.dispose();
  }
}
