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
- the task observer (:class:`~nbcluster.jupyter.cells.CellTracker`): which cell
  submitted each task and actor call; re-running a cell cancels the unreferenced pending
  work of its previous run; a second interrupt force-kills what the first one cancelled;
- after every cell, a look for redefined actor classes whose old actors still run
  (:mod:`~nbcluster.jupyter.versions`: one warning, ``%cluster restart-actors``), and
  the output-ref policy (:mod:`~nbcluster.jupyter.memory`): refs
  kept only by IPython's output history (``Out[n]``) are dropped (default: all but the
  10 most recent such outputs);
- in an ipykernel, the keep-alive (:mod:`~nbcluster.jupyter.keepalive`), so idle
  culling spares a kernel whose tasks run.

The hooks belong to one connection: after ``shutdown()`` and a new ``init()`` they are
installed again (``%cluster start``/``connect`` do it, and so does the check the
extension runs before and after every cell).
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from nbcluster import state
from nbcluster.jupyter.cells import CellTracker
from nbcluster.jupyter.keepalive import KeepAlive, keepalive_interval
from nbcluster.jupyter.memory import DEFAULT_OUT_POLICY, OutPolicy, apply_out_policy
from nbcluster.jupyter.output import OUTPUT_MODES, OutputRouter, cell_header, kernel_of
from nbcluster.jupyter.versions import CodeVersions

__all__ = ["ON_INTERRUPT_CHOICES", "InterruptHandler", "KernelHooks", "OnInterrupt"]

log = logging.getLogger(__name__)

OnInterrupt = Literal["cancel", "keep"]
ON_INTERRUPT_CHOICES: tuple[OnInterrupt, ...] = ("cancel", "keep")


def _default_output_mode() -> str:
    """``"log"`` when the log-area widget can be made here, else ``"stream"``."""
    try:
        import anywidget  # noqa: F401 - only whether it is there
    except ImportError:
        return "stream"
    return "log"


class InterruptHandler:
    """Called by ``get``/``wait`` on ``KeyboardInterrupt``, on the thread that was waiting.

    Finds the tasks submitted by the cell being interrupted (same ``msg_id`` in their
    submit context as ``current_cell()``) that have not finished. With ``"cancel"`` it
    cancels them politely (a ``KeyboardInterrupt`` inside each task) and waits up to
    ``grace_s`` seconds for them to stop, the cell still busy; **interrupting again**
    meanwhile force-kills the workers still running them. With ``"keep"`` it leaves them
    running and says how many. It never raises: the ``KeyboardInterrupt`` must reach the
    user.
    """

    def __init__(
        self,
        current_cell: Callable[[], dict[str, Any] | None],
        on_interrupt: OnInterrupt = "cancel",
        grace_s: float = 10.0,
    ) -> None:
        self.current_cell = current_cell
        self.on_interrupt: OnInterrupt = on_interrupt
        self.grace_s = grace_s

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
                _say(f"nbcluster: interrupted; cancelled {n} task(s) submitted by this cell")
                if n:
                    self._grace(same_cell)
            else:
                n = len(state.pending_tasks(same_cell))
                _say(
                    f"nbcluster: interrupted; {n} task(s) submitted by this cell keep running "
                    "(on-interrupt is 'keep'; nbcluster.cancel(ref) stops one)"
                )
        except Exception:  # noqa: BLE001 - the KeyboardInterrupt must still propagate
            log.exception("nbcluster interrupt handler failed")

    def _grace(self, same_cell: Callable[[Any], bool]) -> None:
        """Wait for the cancelled tasks to stop; a second interrupt force-kills them."""
        deadline = time.monotonic() + self.grace_s
        told = False
        try:
            while time.monotonic() < deadline:
                left = len(state.pending_tasks(same_cell))
                if not left:
                    return
                if not told and time.monotonic() > deadline - self.grace_s + 0.5:
                    _say(
                        f"nbcluster: {left} task(s) still running; interrupt again to "
                        "force-kill their workers"
                    )
                    told = True
                time.sleep(0.05)
            left = len(state.pending_tasks(same_cell))
            if left:
                _say(
                    f"nbcluster: {left} task(s) did not stop; nbcluster.cancel(ref, force=True) "
                    "kills one"
                )
        except KeyboardInterrupt:
            n = state.cancel_tasks(same_cell, force=True)
            _say(f"nbcluster: interrupted again; force-killed the workers of {n} task(s)")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
        #: Which cell submitted each task; re-runs cancel unreferenced work (``%cluster rerun``).
        self.cells = CellTracker()
        self.cells.activate()
        #: Redefined actor classes and their old actors (``%cluster restart-actors``).
        self.versions = CodeVersions(shell)

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
        state.set_task_observer(self.cells.observe)
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
            state.set_task_observer(None)
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

    def current_cell_header(self) -> dict[str, Any] | None:
        """The running cell's header, without telling its log area anything."""
        return cell_header(self.shell) if self._kernel is not None else self._plain_cell

    @staticmethod
    def _guard(fn: Callable[[], Any]) -> None:
        """Run a per-cell step; its failure is logged, never raised into the cell."""
        try:
            fn()
        except Exception:  # noqa: BLE001 - never break the cell that just ran
            log.debug("nbcluster: a per-cell step failed", exc_info=True)

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

    def cell_started(self, info: Any = None) -> None:
        """A cell starts (``pre_run_cell``): outside a kernel, give it a name; remember which
        notebook cell it is (``info.cell_id``) and its ``In [n]``."""
        self._cell_running = True
        if self._kernel is None:
            self._plain_cell = {"msg_id": f"ipython-{uuid.uuid4().hex}", "msg_type": "cell"}
        header = self.current_cell_header()
        if self._router is not None:
            self._router.areas.cell_started(str(header["msg_id"]) if header else None)
        self.cells.cell_started(header, getattr(info, "cell_id", None))
        self._guard(self.versions.sync_reloadable_modules)

    def cell_finished(self, result: Any = None) -> None:
        """A cell finished (``post_run_cell``): its log area is put in place if it submitted
        work; ``Out[n]`` refs the output-ref policy no longer keeps are dropped; outside a
        kernel, no cell runs now."""
        self._cell_running = False
        self._guard(lambda: apply_out_policy(self.shell.user_ns, self.out_policy, self.shell))
        count = getattr(result, "execution_count", None)
        if not getattr(getattr(result, "info", None), "store_history", True):
            count = None  # IPython gives such a cell the next cell's number: it has none
        self._guard(lambda: self.cells.cell_finished(count))
        self._guard(self.versions.check)
        self._guard(self.versions.sync_reloadable_modules)
        if self._router is not None:
            self._router.flush()
            self._router.areas.cell_finished(cell_header(self.shell))
        if self._kernel is None:
            self._plain_cell = None
