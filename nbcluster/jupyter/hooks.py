"""Plug a kernel into the driver's hooks: submit context, task output, interrupts.

:class:`KernelHooks` installs, for the connection the process has now,

- the submit-context provider, so every task knows the cell that submitted it: in a
  kernel the header of the cell's message (:func:`~nbcluster.jupyter.output.cell_header`),
  in plain IPython a stand-in header naming the cell, made when the cell starts;
- in an ipykernel, the output handler (:class:`~nbcluster.jupyter.output.OutputRouter`),
  so task output appears under that cell; elsewhere (plain IPython, scripts) the default
  printing stays;
- the interrupt handler (:class:`InterruptHandler`), so interrupting a cell that waits
  in ``get``/``wait`` cancels the tasks that cell submitted (``on_interrupt="cancel"``)
  or leaves them running and says how many (``"keep"``);
- after every cell, the output-ref policy (:mod:`~nbcluster.jupyter.memory`): refs
  kept only by IPython's output history (``Out[n]``) are dropped (default: all but the
  10 most recent such outputs);
- in an ipykernel, the keep-alive (:class:`KeepAlive`): while tasks this kernel submitted
  run and no cell executes, the kernel reports activity every ``NBCLUSTER_KEEPALIVE_S``
  seconds (default 60; 0 turns it off), so an idle culler (jupyter_server's, Binder's)
  does not shut down a kernel whose cluster is working. When the culler does shut the
  kernel down, its cluster ends with it (the parent-death watch).

The hooks belong to one connection: after ``shutdown()`` and a new ``init()`` they are
installed again (``%cluster start``/``connect`` do it, and so does the check the
extension runs before and after every cell).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any, Literal

from nbcluster import state
from nbcluster.jupyter.memory import DEFAULT_OUT_POLICY, OutPolicy, apply_out_policy
from nbcluster.jupyter.output import OUTPUT_MODES, OutputRouter, cell_header, kernel_of

__all__ = ["ON_INTERRUPT_CHOICES", "InterruptHandler", "KeepAlive", "KernelHooks", "OnInterrupt"]

log = logging.getLogger(__name__)

OnInterrupt = Literal["cancel", "keep"]
ON_INTERRUPT_CHOICES: tuple[OnInterrupt, ...] = ("cancel", "keep")
#: Seconds between two activity reports while tasks run (environment variable; 0: off).
KEEPALIVE_ENV = "NBCLUSTER_KEEPALIVE_S"
DEFAULT_KEEPALIVE_S = 60.0


def _default_output_mode() -> str:
    """``"log"`` when the log-area widget can be made here, else ``"stream"``."""
    try:
        import anywidget  # noqa: F401 - only whether it is there
    except ImportError:
        return "stream"
    return "log"


def keepalive_interval() -> float:
    """``$NBCLUSTER_KEEPALIVE_S`` (default 60 s; 0 or less turns the keep-alive off)."""
    raw = os.environ.get(KEEPALIVE_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_KEEPALIVE_S
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %s", KEEPALIVE_ENV, raw, 60)
        return DEFAULT_KEEPALIVE_S


class KeepAlive:
    """Reports kernel activity while ``working()`` says tasks run and no cell executes.

    The report is an iopub ``status: idle`` message with no parent: true (no cell runs),
    ignored by front ends, and counted as activity by jupyter_server (which is what its
    culler and JupyterHub's, through the server's last activity, look at). A thread
    ``nbcluster-keepalive`` checks every ``interval`` seconds; :meth:`close` stops it.
    """

    def __init__(self, kernel: Any, working: Callable[[], bool], interval: float) -> None:
        self._kernel = kernel
        self._working = working
        self.interval = interval
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbcluster-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self._working():
                    self.beat()
            except Exception:  # noqa: BLE001 - a keep-alive must never disturb the kernel
                log.debug("nbcluster keep-alive failed", exc_info=True)

    def beat(self) -> None:
        """Publish one activity report now."""
        kernel = self._kernel
        topic = kernel._topic("status") if hasattr(kernel, "_topic") else b"kernel.status"
        kernel.session.send(
            kernel.iopub_socket, "status", {"execution_state": "idle"}, parent={}, ident=topic
        )
        self.sent += 1

    def close(self) -> None:
        """Stop reporting."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)


class InterruptHandler:
    """Called by ``get``/``wait`` on ``KeyboardInterrupt``, on the thread that was waiting.

    Finds the tasks submitted by the cell being interrupted (same ``msg_id`` in their
    submit context as ``current_cell()``) that have not finished, cancels them unless
    ``on_interrupt`` is ``"keep"``, and prints one line saying so. It never raises: the
    ``KeyboardInterrupt`` must reach the user.
    """

    def __init__(
        self,
        current_cell: Callable[[], dict[str, Any] | None],
        on_interrupt: OnInterrupt = "cancel",
    ) -> None:
        self.current_cell = current_cell
        self.on_interrupt: OnInterrupt = on_interrupt

    def __call__(self) -> None:
        try:
            header = self.current_cell()
            msg_id = header.get("msg_id") if header else None
            if not msg_id:
                return

            def same_cell(ctx: Any) -> bool:
                return isinstance(ctx, dict) and ctx.get("msg_id") == msg_id

            if self.on_interrupt == "cancel":
                n = state.cancel_tasks(same_cell)
                line = f"nbcluster: interrupted; cancelled {n} task(s) submitted by this cell"
            else:
                n = len(state.pending_tasks(same_cell))
                line = (
                    f"nbcluster: interrupted; {n} task(s) submitted by this cell keep running "
                    "(on-interrupt is 'keep'; nbcluster.cancel(ref) stops one)"
                )
            print(line, file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - the KeyboardInterrupt must still propagate
            log.exception("nbcluster interrupt handler failed")


class KernelHooks:
    """The hooks of one shell, (re)installed on each new driver connection."""

    def __init__(self, shell: Any, on_interrupt: OnInterrupt = "cancel") -> None:
        self.shell = shell
        self.interrupt_handler = InterruptHandler(self.current_cell, on_interrupt)
        self._router: OutputRouter | None = None
        self._installed_job = ""
        self._kernel = kernel_of(shell)
        self._plain_cell: dict[str, Any] | None = None  # outside a kernel: the running cell
        self._cell_running = False
        self._output_mode = _default_output_mode()
        self.keepalive: KeepAlive | None = None
        #: What happens to refs kept in ``Out[n]`` after each cell (``%cluster out-refs``).
        self.out_policy: OutPolicy = DEFAULT_OUT_POLICY

    @property
    def on_interrupt(self) -> OnInterrupt:
        """What an interrupted ``get``/``wait`` does to the cell's tasks."""
        return self.interrupt_handler.on_interrupt

    @on_interrupt.setter
    def on_interrupt(self, value: OnInterrupt) -> None:
        if value not in ON_INTERRUPT_CHOICES:
            raise ValueError(f"on_interrupt must be one of {ON_INTERRUPT_CHOICES}, got {value!r}")
        self.interrupt_handler.on_interrupt = value

    @property
    def output_mode(self) -> str:
        """Where task output goes in a kernel: ``"log"`` (each cell's log area) or ``"stream"``."""
        return self._output_mode

    @output_mode.setter
    def output_mode(self, value: str) -> None:
        if value not in OUTPUT_MODES:
            raise ValueError(f"output mode must be one of {OUTPUT_MODES}, got {value!r}")
        self._output_mode = value
        if self._router is not None:
            self._router.mode = value

    def install(self) -> None:
        """Install the hooks on the current connection (it must exist)."""
        state.set_submit_context_provider(self.current_cell)
        state.set_interrupt_handler(self.interrupt_handler)
        kernel = self._kernel
        if kernel is not None:
            if self._router is None:
                self._router = OutputRouter(kernel, mode=self._output_mode)
                if self._cell_running:  # installed by the cell that runs now
                    header = cell_header(self.shell)
                    self._router.areas.cell_started(str(header["msg_id"]) if header else None)
            state.set_output_handler(self._router.handle)
            interval = keepalive_interval()
            if self.keepalive is None and interval > 0:
                self.keepalive = KeepAlive(kernel, self.tasks_running_idle, interval)
        self._installed_job = state.session_info()["job_id"]

    def tasks_running_idle(self) -> bool:
        """True when no cell executes and tasks this kernel submitted have not finished."""
        if self._cell_running or not state.is_connected():
            return False
        try:
            return bool(state.pending_tasks())
        except Exception:  # noqa: BLE001 - a driver without a task table (client mode)
            return False

    def ensure_installed(self) -> None:
        """Install the hooks if the process has a connection they are not on yet."""
        if state.is_connected() and state.session_info()["job_id"] != self._installed_job:
            self.install()

    def uninstall(self) -> None:
        """Put the driver's defaults back (if connected) and stop the output thread."""
        if state.is_connected() and state.session_info()["job_id"] == self._installed_job:
            state.set_submit_context_provider(None)
            state.set_interrupt_handler(None)
            state.set_output_handler(None)
        self._installed_job = ""
        if self._router is not None:
            self._router.close()
            self._router = None
        if self.keepalive is not None:
            self.keepalive.close()
            self.keepalive = None

    def flush(self) -> None:
        """Publish buffered task output now."""
        if self._router is not None:
            self._router.flush()

    def current_cell(self) -> dict[str, Any] | None:
        """The header naming the cell that runs now (the submit context of its tasks).

        The driver calls it for every submission, so it also tells the cell's log area
        that the cell submitted work.
        """
        if self._kernel is not None:
            header = cell_header(self.shell)
            if header is not None and self._router is not None:
                self._router.areas.submitted(str(header["msg_id"]))
            return header
        return self._plain_cell

    def cell_started(self) -> None:
        """A cell starts (``pre_run_cell``): outside a kernel, give it a name."""
        self._cell_running = True
        if self._router is not None:
            header = cell_header(self.shell)
            self._router.areas.cell_started(str(header["msg_id"]) if header else None)
        if self._kernel is None:
            self._plain_cell = {"msg_id": f"ipython-{uuid.uuid4().hex}", "msg_type": "cell"}

    def cell_finished(self) -> None:
        """A cell finished (``post_run_cell``): its log area is put in place if it submitted
        work; ``Out[n]`` refs the output-ref policy no longer keeps are dropped; outside a
        kernel, no cell runs now."""
        self._cell_running = False
        try:
            apply_out_policy(self.shell.user_ns, self.out_policy, self.shell)
        except Exception:  # noqa: BLE001 - never break the cell that just ran
            log.debug("nbcluster: applying the output-ref policy failed", exc_info=True)
        if self._router is not None:
            self._router.flush()
            self._router.areas.cell_finished(cell_header(self.shell))
        if self._kernel is None:
            self._plain_cell = None
