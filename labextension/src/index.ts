/**
 * nbcluster's JupyterLab extension: the clusters sidebar, the status-bar item, and the
 * command-palette entries. Data comes from the server extension (`/nbcluster/api/`).
 */

import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { canRunAsJob } from './jobsModels';
import { asNotebook, INotebookLike, kernelIdOf } from './notebook';
import { asNotebookWithMetadata, NotebookMetadataSync } from './notebookmeta';
import { ClusterPanel } from './panel';
import { ClusterStatusItem } from './statusbar';
import { ClusterStore, DEFAULT_POLL_INTERVAL } from './store';

const PLUGIN_ID = 'nbcluster:plugin';

/** Command ids. */
export namespace CommandIDs {
  export const openPanel = 'nbcluster:open-panel';
  export const startCluster = 'nbcluster:start-cluster';
  export const refresh = 'nbcluster:refresh';
  export const insertConnectCode = 'nbcluster:insert-connect-code';
  export const stopCluster = 'nbcluster:stop-cluster';
  export const scaleCluster = 'nbcluster:scale-cluster';
  export const submitAsJob = 'nbcluster:submit-as-job';
}

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">
<g class="jp-icon3" fill="#616161">
<circle cx="12" cy="5" r="3"/><circle cx="5" cy="18" r="3"/><circle cx="19" cy="18" r="3"/>
<path d="M11 7.5h2v3.2l5 4.3-1.3 1.5L12 12.4l-4.7 4.1L6 15l5-4.3z"/>
</g></svg>`;

const clusterIcon = new LabIcon({ name: 'nbcluster:cluster', svgstr: ICON_SVG });

function activate(
  app: JupyterFrontEnd,
  labShell: ILabShell | null,
  statusBar: IStatusBar | null,
  palette: ICommandPalette | null,
  settings: ISettingRegistry | null
): void {
  const store = new ClusterStore();
  let lastNotebook: INotebookLike | null = null;

  const currentNotebook = (): INotebookLike | null => {
    const current = asNotebook(app.shell.currentWidget as Widget | null);
    if (current !== null) {
      lastNotebook = current;
    } else if (lastNotebook !== null && lastNotebook.isDisposed) {
      lastNotebook = null;
    }
    return current ?? lastNotebook;
  };

  const insertConnectCode = async (id: string): Promise<void> => {
    const notebook = currentNotebook();
    if (notebook === null) {
      throw new Error('Open a notebook first: the connect code goes into the active notebook.');
    }
    const code = await store.connectCode(id);
    app.shell.activateById(notebook.id);
    await notebook.sessionContext.ready;
    const active = notebook.content.activeCell;
    if (active === null || active.model.sharedModel.getSource().trim() !== '') {
      await app.commands.execute('notebook:insert-cell-below'); // else: use the empty cell
    }
    const cell = notebook.content.activeCell;
    if (cell === null) {
      throw new Error('The notebook has no active cell to put the connect code in.');
    }
    cell.model.sharedModel.setSource(code);
    await app.commands.execute('notebook:run-cell');
    store.markConnected(id, kernelIdOf(notebook));
  };

  // Notebooks carry their cluster: %cluster start's record goes into the metadata, and a
  // notebook's record goes to its kernel when the kernel starts.
  const metadataSync = new NotebookMetadataSync();
  const trackNotebooks = (): void => {
    for (const widget of app.shell.widgets('main')) {
      const notebook = asNotebookWithMetadata(widget);
      if (notebook !== null) {
        metadataSync.track(notebook);
      }
    }
  };
  labShell?.layoutModified.connect(trackNotebooks);
  labShell?.currentChanged.connect(trackNotebooks);
  app.restored.then(trackNotebooks).catch(() => undefined);

  const panel = new ClusterPanel(store, { insertConnectCode });
  panel.title.icon = clusterIcon;
  app.shell.add(panel, 'left', { rank: 900 });

  const { commands } = app;
  const clusterArg = (args: Record<string, unknown>): string | null => {
    if (typeof args.id === 'string') {
      return args.id;
    }
    return store.clusterFor(kernelIdOf(currentNotebook()))?.id ?? null;
  };

  commands.addCommand(CommandIDs.openPanel, {
    label: 'Show nbcluster Clusters',
    caption: 'Show the clusters on this server',
    execute: () => app.shell.activateById(panel.id)
  });
  commands.addCommand(CommandIDs.startCluster, {
    label: 'Start a Local nbcluster Cluster',
    caption: 'Start a cluster with the CPUs and nodes set in the panel',
    execute: async () => {
      app.shell.activateById(panel.id);
      await panel.startFromForm();
    }
  });
  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh nbcluster Clusters',
    execute: () => store.refresh()
  });
  commands.addCommand(CommandIDs.insertConnectCode, {
    label: 'Insert nbcluster Connect Code',
    caption: 'Attach the active notebook’s kernel to a cluster',
    isEnabled: () => currentNotebook() !== null && store.clusters.length > 0,
    execute: async args => {
      const id = clusterArg(args);
      if (id !== null) {
        await panel.run(() => insertConnectCode(id));
      }
    }
  });
  commands.addCommand(CommandIDs.stopCluster, {
    label: 'Stop nbcluster Cluster',
    execute: async args => {
      const id = clusterArg(args);
      if (id !== null) {
        await panel.run(() => store.stop(id));
      }
    }
  });
  commands.addCommand(CommandIDs.scaleCluster, {
    label: 'Scale nbcluster Cluster',
    execute: async args => {
      const id = clusterArg(args);
      if (id !== null && typeof args.nodes === 'number') {
        const nodes = args.nodes;
        await panel.run(() => store.scale(id, nodes));
      }
    }
  });
  // Jobs (issue 17): run the open notebook or script on the selected cluster as a job.
  const currentPath = (): string | null => {
    const widget = app.shell.currentWidget as unknown as {
      context?: { path?: unknown };
    } | null;
    const path = widget?.context?.path;
    return typeof path === 'string' ? path : null;
  };
  commands.addCommand(CommandIDs.submitAsJob, {
    label: 'Submit as nbcluster Job',
    caption:
      'Run this notebook or script on the cluster as a job, with its folder as the working_dir',
    isEnabled: () => canRunAsJob(currentPath()),
    execute: async args => {
      const given = typeof args.path === 'string' ? args.path : null;
      const path = given ?? currentPath();
      app.shell.activateById(panel.id);
      if (!canRunAsJob(path)) {
        panel.showError('Open a notebook (.ipynb) or a Python script (.py) to run it as a job.');
        return;
      }
      await panel.run(async () => {
        if (given === null && commands.hasCommand('docmanager:save')) {
          await commands.execute('docmanager:save'); // the job runs what is on disk
        }
        await panel.jobs.submit(path as string);
      });
    }
  });

  if (palette) {
    const category = 'nbcluster';
    for (const command of [
      CommandIDs.openPanel,
      CommandIDs.startCluster,
      CommandIDs.refresh,
      CommandIDs.insertConnectCode,
      CommandIDs.submitAsJob
    ]) {
      palette.addItem({ command, category });
    }
  }

  if (statusBar) {
    const item = new ClusterStatusItem(
      store,
      () => kernelIdOf(currentNotebook()),
      () => app.shell.activateById(panel.id)
    );
    statusBar.registerStatusItem('nbcluster:status', {
      item,
      align: 'left',
      rank: 900
    });
    labShell?.currentChanged.connect(() => item.refresh());
  }

  if (settings) {
    const apply = (s: ISettingRegistry.ISettings): void => {
      const interval = s.get('pollInterval').composite;
      store.setInterval(typeof interval === 'number' ? interval : DEFAULT_POLL_INTERVAL);
    };
    settings
      .load(PLUGIN_ID)
      .then(s => {
        apply(s);
        s.changed.connect(apply);
      })
      .catch(reason => console.error('nbcluster: could not load settings', reason));
  }
  void store.refresh();
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Clusters in the sidebar, cluster load in the status bar.',
  autoStart: true,
  optional: [ILabShell, IStatusBar, ICommandPalette, ISettingRegistry],
  activate
};

export default plugin;
