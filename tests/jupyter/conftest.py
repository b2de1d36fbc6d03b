"""Real Jupyter kernels for the Jupyter-layer tests.

``kernel`` is a factory fixture: ``k = kernel()`` starts an ipykernel (the venv's, via
jupyter_client's ``KernelManager``) with ``NBCLUSTER_TEMP_DIR`` pointing at this test
session's temp dir, and returns a :class:`Kernel`. Every kernel started is shut down at
teardown, and every cluster session a kernel reported (``Kernel.session_dir``) is
checked for leftover processes.

:class:`Kernel` wraps a ``BlockingKernelClient`` and keeps *every* iopub message it has
seen, so that tests can run cells back to back and later ask which cell a message
belonged to (``parent_header.msg_id``).
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from nbcluster.testing import assert_no_processes

#: Deadline for anything a kernel does in these tests (generous: shared CI machines).
DEADLINE_S = 60.0
#: Deadline for a kernel to start (the first one of a run imports everything cold).
START_DEADLINE_S = 180.0


class Kernel:
    """One running kernel: execute cells and look at the iopub messages they caused."""

    def __init__(self, km: KernelManager) -> None:
        self.km = km
        self.client = km.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=START_DEADLINE_S)
        self.messages: list[dict[str, Any]] = []
        self.replies: dict[str, dict[str, Any]] = {}
        self.session_dirs: list[str] = []

    @property
    def pid(self) -> int:
        """The kernel process's PID, as the KernelManager knows it."""
        pid = self.km.provisioner.pid  # type: ignore[union-attr]
        assert isinstance(pid, int) and pid > 0, pid
        return pid

    def submit(self, code: str, cell_id: str | None = None, store_history: bool = False) -> str:
        """Send an execute request; return its msg_id without waiting.

        ``cell_id`` is sent as the request's ``cellId`` metadata, as JupyterLab does (which
        notebook cell this is); ``store_history`` gives the cell an ``In [n]``.
        """
        content = {
            "code": code,
            "silent": False,
            "store_history": store_history,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        metadata = {"cellId": cell_id} if cell_id else {}
        msg = self.client.session.msg("execute_request", content, metadata=metadata)
        self.client.shell_channel.send(msg)
        return str(msg["header"]["msg_id"])

    def pump(self, timeout: float = 0.1) -> None:
        """Move pending iopub and shell messages into :attr:`messages` / :attr:`replies`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            got = False
            try:
                self.messages.append(self.client.get_iopub_msg(timeout=remaining))
                got = True
            except queue.Empty:
                pass
            try:
                while True:
                    reply = self.client.get_shell_msg(timeout=0)
                    self.replies[reply["parent_header"]["msg_id"]] = reply
            except queue.Empty:
                pass
            if not got and time.monotonic() >= deadline:
                return

    def wait_for(
        self, predicate: Callable[[], Any], timeout: float = DEADLINE_S, what: str = ""
    ) -> Any:
        """Pump messages until ``predicate()`` is truthy; fail at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what or predicate}; "
                    f"streams so far: {self.stream_text()[-2000:]!r}"
                )
            self.pump(0.1)

    def _status(self, msg_id: str, execution_state: str) -> bool:
        return any(
            m["msg_type"] == "status"
            and m["content"].get("execution_state") == execution_state
            and m["parent_header"].get("msg_id") == msg_id
            for m in self.messages
        )

    def busy(self, msg_id: str) -> bool:
        """True once the kernel started handling ``msg_id``."""
        return self._status(msg_id, "busy")

    def idle(self, msg_id: str) -> bool:
        """True once the kernel went idle after handling ``msg_id``."""
        return self._status(msg_id, "idle")

    def wait_done(self, msg_id: str, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """Wait for the execute reply and the idle status of ``msg_id``; return the reply."""
        self.wait_for(
            lambda: msg_id in self.replies and self.idle(msg_id), timeout, f"cell {msg_id}"
        )
        return self.replies[msg_id]

    def run(self, code: str, timeout: float = DEADLINE_S, **submit: Any) -> str:
        """Execute ``code``; fail unless it succeeds; return the msg_id."""
        msg_id = self.submit(code, **submit)
        reply = self.wait_done(msg_id, timeout)
        if reply["content"]["status"] != "ok":
            raise AssertionError(
                f"cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}\n"
                + "\n".join(reply["content"].get("traceback", []))
                + f"\nstreams: {self.stream_text(msg_id)[-2000:]!r}"
            )
        return msg_id

    def streams(self, msg_id: str | None = None) -> list[dict[str, Any]]:
        """``stream`` messages seen so far (of the cell ``msg_id``, if given)."""
        return [
            m
            for m in self.messages
            if m["msg_type"] == "stream"
            and (msg_id is None or m["parent_header"].get("msg_id") == msg_id)
        ]

    def stream_text(self, msg_id: str | None = None) -> str:
        """All stream text seen so far (of the cell ``msg_id``, if given)."""
        return "".join(m["content"]["text"] for m in self.streams(msg_id))

    def log_area(self, msg_id: str) -> str | None:
        """The widget model id of the cell ``msg_id``'s log area, once it is displayed."""
        for m in self.messages:
            if m["msg_type"] == "display_data" and m["parent_header"].get("msg_id") == msg_id:
                view = m["content"]["data"].get("application/vnd.jupyter.widget-view+json")
                if view and self.widget_state(view["model_id"]).get("_anywidget_id", "").endswith(
                    "CellLog"
                ):
                    return str(view["model_id"])
        return None

    def task_output(self, msg_id: str) -> str:
        """What tasks of the cell ``msg_id`` printed: its log area's lines and its streams."""
        area = self.log_area(msg_id)
        lines = self.widget_state(area).get("lines", []) if area else []
        return "".join(line[4] for line in lines) + self.stream_text(msg_id)

    def widget_state(self, model_id: str) -> dict[str, Any]:
        """A widget's state as the front end knows it: its comm_open, then every update."""
        state: dict[str, Any] = {}
        for m in self.messages:
            content = m["content"]
            if content.get("comm_id") != model_id:
                continue
            data = content.get("data", {})
            if m["msg_type"] == "comm_open" or data.get("method") == "update":
                state.update(data.get("state", {}))
        return state

    def comm_updates(self, model_id: str) -> list[dict[str, Any]]:
        """The ``update`` messages a widget sent, in order."""
        return [
            m
            for m in self.messages
            if m["msg_type"] == "comm_msg"
            and m["content"].get("comm_id") == model_id
            and m["content"].get("data", {}).get("method") == "update"
        ]

    def eval_text(self, expr: str) -> str:
        """Print ``expr`` in the kernel between markers and return what it printed."""
        msg_id = self.run(f"print('<<<' + str({expr}) + '>>>')")
        self.wait_for(lambda: ">>>" in self.stream_text(msg_id), what=f"value of {expr}")
        text = self.stream_text(msg_id)
        return text[text.index("<<<") + 3 : text.index(">>>")]

    def start_cluster(self, args: str = "--num-cpus 2") -> str:
        """``%load_ext nbcluster`` + ``%cluster start ARGS``; return the session dir."""
        self.run(f"%load_ext nbcluster\n%cluster start {args}")
        session_dir = self.eval_text("__import__('nbcluster').state.session_info()['session_dir']")
        self.session_dirs.append(session_dir)
        return session_dir

    def stop(self) -> None:
        """Close the channels and shut the kernel down (killing it if it does not exit)."""
        try:
            self.client.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=False)


@pytest.fixture
def kernel() -> Iterator[Callable[..., Kernel]]:
    """Factory: ``kernel(env={...})`` starts a real ipykernel (with extra environment
    variables); all are shut down and leak-checked at teardown."""
    started: list[Kernel] = []

    def start(env: dict[str, str] | None = None) -> Kernel:
        km = KernelManager(kernel_name="python3")
        km.start_kernel(env={**os.environ, **(env or {})}, cwd=os.getcwd())
        try:
            k = Kernel(km)
        except BaseException:
            km.shutdown_kernel(now=True)
            raise
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()
    for k in started:
        for session_dir in k.session_dirs:
            assert_no_processes(session_dir, timeout=15)
