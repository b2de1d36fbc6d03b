/**
 * The few notebook operations the extension needs, typed structurally.
 *
 * Depending on `@jupyterlab/notebook` would pull its whole dependency tree into the
 * build for two calls; the running JupyterLab provides the real objects, and these
 * interfaces name exactly the parts used.
 */

import { Widget } from '@lumino/widgets';

/** The parts of a `NotebookPanel` used here. */
export interface INotebookLike extends Widget {
  content: {
    activeCell: {
      model: { sharedModel: { getSource(): string; setSource(source: string): void } };
    } | null;
  };
  sessionContext: {
    ready: Promise<void>;
    session: { kernel: { id: string } | null } | null;
  };
}

/** The widget as a notebook panel, or null when it is something else. */
export function asNotebook(widget: Widget | null | undefined): INotebookLike | null {
  if (!widget || !widget.hasClass('jp-NotebookPanel')) {
    return null;
  }
  const candidate = widget as unknown as Record<string, unknown>;
  if (typeof candidate.content !== 'object' || typeof candidate.sessionContext !== 'object') {
    return null;
  }
  return widget as unknown as INotebookLike;
}

/** The id of the notebook's kernel, or null. */
export function kernelIdOf(notebook: INotebookLike | null): string | null {
  return notebook?.sessionContext.session?.kernel?.id ?? null;
}
