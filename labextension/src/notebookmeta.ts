/**
 * A notebook carries its cluster (issue 13): the glue between the kernel and the notebook
 * file's metadata, which the kernel cannot write itself.
 *
 * - Kernel → notebook: `%cluster start` publishes a `display_data` message of type
 *   `METADATA_MIME` holding the record; when one arrives on a notebook's kernel, it is
 *   written to the notebook's metadata under `"nbcluster"` (saved with the notebook).
 * - Notebook → kernel: when a notebook's kernel starts or restarts and the notebook has
 *   a record, it is handed to the kernel (a silent execute that sets the environment
 *   variable `NBCLUSTER_NOTEBOOK_METADATA`, base64 JSON: no import, no output, no
 *   history), so `%cluster start` without arguments can start the same cluster.
 *
 * The pure parts (`recordFromMessage`, `primeCode`) are tested with jest.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { KernelMessage } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

/** The notebook metadata key of the record. */
export const METADATA_KEY = 'nbcluster';
/** The MIME type of the kernel's "record this" display message. */
export const METADATA_MIME = 'application/vnd.nbcluster.notebook-metadata+json';
/** The environment variable the kernel reads the record from. */
export const METADATA_ENV = 'NBCLUSTER_NOTEBOOK_METADATA';

/** The parts of a notebook panel used here (typed structurally, see notebook.ts). */
export interface INotebookWithMetadata extends Widget {
  model: {
    getMetadata(key: string): unknown;
    setMetadata(key: string, value: unknown): void;
  } | null;
  sessionContext: ISessionContext;
}

/** The panel as a notebook with metadata and a session, or null. */
export function asNotebookWithMetadata(
  widget: Widget | null | undefined
): INotebookWithMetadata | null {
  if (!widget || !widget.hasClass('jp-NotebookPanel')) {
    return null;
  }
  const candidate = widget as unknown as Record<string, unknown>;
  if (typeof candidate.sessionContext !== 'object' || candidate.sessionContext === null) {
    return null;
  }
  return widget as unknown as INotebookWithMetadata;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The record a kernel message asks to store, or null when it is no such message. */
export function recordFromMessage(msg: {
  header: { msg_type: string };
  content: unknown;
}): Record<string, unknown> | null {
  if (msg.header.msg_type !== 'display_data' || !isRecord(msg.content)) {
    return null;
  }
  const data = msg.content.data;
  if (!isRecord(data)) {
    return null;
  }
  const record = data[METADATA_MIME];
  return isRecord(record) && typeof record.version === 'number' ? record : null;
}

/** base64 of the UTF-8 bytes of `text`. */
export function base64Utf8(text: string): string {
  const bytes = new TextEncoder().encode(text);
  let binary = '';
  for (const b of bytes) {
    binary += String.fromCharCode(b);
  }
  return btoa(binary);
}

/**
 * The Python statement that hands `record` to the kernel. Only base64 characters come
 * from the notebook, so nothing in a record can change the code that runs.
 */
export function primeCode(record: unknown): string {
  const payload = base64Utf8(JSON.stringify(record));
  if (!/^[A-Za-z0-9+/=]*$/.test(payload)) {
    throw new Error('unexpected characters in the base64 payload');
  }
  return `__import__('os').environ['${METADATA_ENV}'] = '${payload}'`;
}

/** Keeps every open notebook's record in step with its kernel (see the module doc). */
export class NotebookMetadataSync {
  /** Watch `panel` (idempotent). */
  track(panel: INotebookWithMetadata): void {
    if (this._tracked.has(panel)) {
      return;
    }
    // One "start" per kernel start: a restarted kernel has forgotten its record.
    const state = { starts: 0, primed: '' };
    this._tracked.set(panel, state);
    const session = panel.sessionContext;
    const key = (): string | null => {
      const kernel = session.session?.kernel;
      return kernel ? `${kernel.id}:${state.starts}` : null;
    };
    const onIOPub = (_: unknown, msg: KernelMessage.IMessage): void => {
      const record = recordFromMessage(msg);
      if (record !== null && panel.model !== null) {
        panel.model.setMetadata(METADATA_KEY, record);
        state.primed = key() ?? ''; // the kernel that asked knows it already
      }
    };
    const onStatus = (_: unknown, status: string): void => {
      if (status === 'restarting' || status === 'autorestarting' || status === 'starting') {
        state.starts += 1;
      } else if (status === 'idle') {
        void this._prime(panel, state, key());
      }
    };
    const onKernel = (): void => {
      state.starts += 1;
    };
    session.iopubMessage.connect(onIOPub);
    session.statusChanged.connect(onStatus);
    session.kernelChanged.connect(onKernel);
    panel.disposed.connect(() => {
      session.iopubMessage.disconnect(onIOPub);
      session.statusChanged.disconnect(onStatus);
      session.kernelChanged.disconnect(onKernel);
      this._tracked.delete(panel);
    });
    void this._prime(panel, state, key());
  }

  /** Tell the notebook's kernel its record, once per kernel start (if it has one). */
  private async _prime(
    panel: INotebookWithMetadata,
    state: { primed: string },
    key: string | null
  ): Promise<void> {
    const kernel = panel.sessionContext.session?.kernel;
    if (!kernel || key === null || state.primed === key || panel.model === null) {
      return;
    }
    state.primed = key;
    const record = panel.model.getMetadata(METADATA_KEY);
    if (!isRecord(record)) {
      return;
    }
    try {
      const future = kernel.requestExecute({
        code: primeCode(record),
        silent: true,
        store_history: false,
        allow_stdin: false,
        stop_on_error: false
      });
      await future.done;
    } catch (reason) {
      console.warn('nbcluster: could not hand the notebook metadata to the kernel', reason);
    }
  }

  private _tracked = new Map<INotebookWithMetadata, { starts: number; primed: string }>();
}
