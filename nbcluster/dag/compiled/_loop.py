"""The actor side of a compiled graph: its channel ends and the loop that runs its calls.

The driver sets a graph up with a few ``__ray_call__`` calls on each actor (they run
:func:`probe`, :func:`open_readers`, :func:`open_writers` and :func:`start_loop` with the
actor's instance), after which a thread of the actor runs, for every execution, the
actor's calls in order: read the arguments from channels (or take the result of an
earlier call on the same actor), call the method, write the result. A method that
raises produces an error item instead, which the calls downstream pass on without
running, up to the driver's ``get``; the loop goes on with the next execution.

The loop ends when a channel it reads is closed (teardown closes the input channel, and
the end spreads downstream), or when a process it writes to is gone. It then closes its
own channels, so the end reaches the driver, which finds out why (:func:`loop_status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import os
import socket
import threading
import traceback
from collections.abc import Callable
from typing import Any

from nbcluster.dag._input_node import DAGInput
from nbcluster.dag.compiled import _relay
from nbcluster.dag.compiled._plan import DRIVER, INPUT_CHANNEL, Plan, Task
from nbcluster.dag.compiled._ring import ERROR, VALUE, ProtocolError
from nbcluster.dag.compiled._shm import ChannelClosed, ShmReader, ShmWriter
from nbcluster.exceptions import TaskError

__all__ = [
    "Failed",
    "Transport",
    "forget_graph",
    "loop_status",
    "make_readers",
    "make_writers",
    "open_readers",
    "open_writers",
    "probe",
    "start_loop",
]


@dataclasses.dataclass(frozen=True)
class Transport:
    """How the channels of graph ``gid`` travel: ``kinds[cid]`` is ``"shm"`` or ``"relay"``."""

    gid: str
    directory: str
    kinds: dict[int, str]
    nslots: int
    capacity: int


class Failed:
    """A call's error as a value flowing through the graph."""

    __slots__ = ("error",)

    def __init__(self, error: TaskError) -> None:
        self.error = error


def make_readers(plan: Plan, key: str, t: Transport) -> dict[int, Any]:
    """Open the read ends of the channels process ``key`` reads."""
    readers: dict[int, Any] = {}
    try:
        for ch in plan.reads(key):
            if t.kinds[ch.cid] == "shm":
                index = ch.readers.index(key)
                readers[ch.cid] = ShmReader(t.directory, ch.cid, index, t.nslots, t.capacity)
            elif key == DRIVER:
                readers[ch.cid] = _relay.RelayDriverReader(t.gid, ch.cid, plan.handles[ch.writer])
            else:
                readers[ch.cid] = _relay.RelayReader(t.gid, ch.cid)
    except BaseException:
        for r in readers.values():
            r.close()
        raise
    return readers


def make_writers(plan: Plan, key: str, t: Transport) -> dict[int, Any]:
    """Open the write ends of the channels process ``key`` writes (readers are open)."""
    writers: dict[int, Any] = {}
    try:
        for ch in plan.writes(key):
            if t.kinds[ch.cid] == "shm":
                w: Any = ShmWriter(t.directory, ch.cid, len(ch.readers), t.nslots, t.capacity)
            else:
                actors = [plan.handles[r] for r in ch.readers if r != DRIVER]
                w = _relay.RelayWriter(t.gid, ch.cid, actors, DRIVER in ch.readers)
            writers[ch.cid] = w
            w.open_wakeups()
    except BaseException:
        for w in writers.values():
            w.close()
        raise
    return writers


# ----------------------------------------------------------------------------- in the actor

_GRAPHS: dict[str, _ActorGraph] = {}
_graphs_lock = threading.Lock()


def _caller(
    instance: object, method: str, loop: asyncio.AbstractEventLoop | None
) -> Callable[..., Any]:
    fn = getattr(instance, method)

    def run_coroutine(coro: Any) -> Any:
        if loop is not None and loop.is_running():
            return asyncio.run_coroutine_threadsafe(coro, loop).result()
        return asyncio.run(coro)

    if inspect.iscoroutinefunction(fn):
        return lambda *a, **k: run_coroutine(fn(*a, **k))

    def call(*a: Any, **k: Any) -> Any:
        result = fn(*a, **k)
        return run_coroutine(result) if inspect.isawaitable(result) else result

    return call


class _ActorGraph:
    """One compiled graph's state in one actor process."""

    def __init__(self, instance: object, plan: Plan, key: str, transport: Transport) -> None:
        self.instance = instance
        self.plan = plan
        self.key = key
        self.transport = transport
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None  # a sync or threaded actor
        self.readers = make_readers(plan, key, transport)
        self.writers: dict[int, Any] = {}
        self.error: str | None = None
        self.thread: threading.Thread | None = None
        self.hostname = socket.gethostname()

    def close(self) -> None:
        for w in self.writers.values():
            with contextlib.suppress(Exception):
                w.close()
        for r in self.readers.values():
            with contextlib.suppress(Exception):
                r.close()

    def _fail(self, task: Task, e: BaseException) -> Failed:
        err = TaskError.from_exception(e, task.name, pid=os.getpid(), hostname=self.hostname)
        return Failed(err)

    def run(self) -> None:
        tasks = self.plan.tasks_of(self.key)
        calls = [_caller(self.instance, t.method, self.loop) for t in tasks]
        readers, writers = self.readers, self.writers
        received: dict[int, Any] = {}  # this execution's items, by channel
        local: dict[int, Any] = {}  # this execution's results, by task

        def value(a: Any) -> Any:
            kind = a.kind
            if kind == "const":
                return a.value
            if kind == "local":
                return local[a.value]
            cid = INPUT_CHANNEL if kind in ("input", "attr") else a.value
            if cid in received:
                v = received[cid]
            else:
                item_kind, v = readers[cid].read()
                if item_kind == ERROR:
                    v = Failed(v)
                elif cid == INPUT_CHANNEL:
                    v = DAGInput(*v)
                received[cid] = v
            if isinstance(v, Failed):
                return v
            if kind == "input":
                return v.single()
            if kind == "attr":
                return v.lookup(*a.value)
            return v

        try:
            while True:
                received.clear()
                local.clear()
                for task, call in zip(tasks, calls, strict=True):
                    args = [value(a) for a in task.args]
                    kwargs = {k: value(a) for k, a in task.kwargs.items()}
                    failed = next(
                        (v for v in (*args, *kwargs.values()) if isinstance(v, Failed)), None
                    )
                    if failed is not None:
                        result: Any = failed
                    else:
                        try:
                            result = call(*args, **kwargs)
                        except Exception as e:  # noqa: BLE001 - the call's error is its result
                            result = self._fail(task, e)
                    local[task.tid] = result
                    if task.out is not None:
                        self._write(writers[task.out], task, result)
        except (ChannelClosed, ProtocolError) as e:
            if isinstance(e, ProtocolError):
                self.error = f"{type(e).__name__}: {e}"
        except BaseException:  # noqa: BLE001 - recorded for the driver, then the loop ends
            self.error = traceback.format_exc()
        finally:
            self.close()
            if self.error is None:  # a failed loop stays, so the driver can ask why
                with _graphs_lock:
                    _GRAPHS.pop(self.transport.gid, None)

    def _write(self, writer: Any, task: Task, result: Any) -> None:
        if isinstance(result, Failed):
            writer.write(ERROR, result.error)
            return
        try:
            writer.write(VALUE, result)
        except ChannelClosed:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. the result cannot be pickled
            writer.write(ERROR, self._fail(task, e).error)


def probe(instance: object, path: str) -> dict[str, Any]:
    """Whether this process sees the driver's channel directory (then shared memory
    works between them), and who it is."""
    return {"visible": os.path.exists(path), "pid": os.getpid(), "host": socket.gethostname()}


def open_readers(instance: object, plan: Plan, key: str, transport: Transport) -> None:
    """Set-up step 1: open this actor's read ends."""
    graph = _ActorGraph(instance, plan, key, transport)
    with _graphs_lock:
        _GRAPHS[transport.gid] = graph


def _graph(gid: str) -> _ActorGraph:
    with _graphs_lock:
        graph = _GRAPHS.get(gid)
    if graph is None:
        raise RuntimeError(f"compiled graph {gid} is not set up in this actor")
    return graph


def open_writers(instance: object, gid: str) -> None:
    """Set-up step 2: open this actor's write ends (every reader is open)."""
    graph = _graph(gid)
    graph.writers = make_writers(graph.plan, graph.key, graph.transport)


def start_loop(instance: object, gid: str) -> None:
    """Set-up step 3: start the loop thread."""
    graph = _graph(gid)
    for r in graph.readers.values():
        r.start()
    graph.thread = threading.Thread(
        target=graph.run, name=f"nbcluster-compiled-graph-{gid}", daemon=True
    )
    graph.thread.start()


def loop_status(instance: object, gid: str) -> dict[str, Any]:
    """Whether the loop of graph ``gid`` runs here, and the error that ended it."""
    with _graphs_lock:
        graph = _GRAPHS.get(gid)
    if graph is None:
        return {"running": False, "error": None}
    running = graph.thread is not None and graph.thread.is_alive()
    return {"running": running, "error": graph.error}


def forget_graph(instance: object, gid: str) -> None:
    """After teardown (or a failed set-up): close what is left of graph ``gid`` here."""
    with _graphs_lock:
        graph = _GRAPHS.pop(gid, None)
    if graph is not None and (graph.thread is None or not graph.thread.is_alive()):
        graph.close()
    _relay.forget(gid)
