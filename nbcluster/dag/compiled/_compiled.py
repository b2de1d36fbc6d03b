"""``CompiledDAG``: an actor graph set up once, then run by channel writes and reads.

``dag.experimental_compile()`` checks the graph (see ``_plan``), creates its channels,
and starts a loop in each actor (see ``_loop``). ``execute(*args)`` then writes the
arguments into the input channel and returns a :class:`CompiledDAGRef` per output;
``get`` on it reads the output channel. No task is submitted and no object is stored per
execution. Results are read in execution order: getting a later result first buffers the
earlier ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Generator
from typing import Any, NoReturn

from nbcluster import _api as core
from nbcluster.dag._dag_node import DAGNode
from nbcluster.dag._input_node import DAGInput
from nbcluster.dag.compiled import _loop
from nbcluster.dag.compiled._errors import (
    CgraphCapacityExceeded,
    ChannelError,
    ChannelTimeoutError,
)
from nbcluster.dag.compiled._plan import DRIVER, INPUT_CHANNEL, build_plan
from nbcluster.dag.compiled._ring import ERROR, VALUE, ring_size
from nbcluster.dag.compiled._shm import ChannelClosed, create_files, fifo_path, ring_path, shm_root
from nbcluster.exceptions import ActorDiedError

__all__ = ["CompiledDAG", "CompiledDAGFuture", "CompiledDAGRef", "compile_dag"]

logger = logging.getLogger(__name__)

#: Defaults, as in Ray's ``DAGContext`` (each can be set per graph at compile time).
DEFAULT_GET_TIMEOUT_S = float(os.environ.get("NBCLUSTER_CGRAPH_GET_TIMEOUT", 10))
DEFAULT_TEARDOWN_TIMEOUT_S = float(os.environ.get("NBCLUSTER_CGRAPH_TEARDOWN_TIMEOUT", 30))
DEFAULT_BUFFER_SIZE_BYTES = int(os.environ.get("NBCLUSTER_CGRAPH_BUFFER_SIZE_BYTES", 1_000_000))
DEFAULT_MAX_INFLIGHT_EXECUTIONS = int(
    os.environ.get("NBCLUSTER_CGRAPH_MAX_INFLIGHT_EXECUTIONS", 10)
)
DEFAULT_MAX_BUFFERED_RESULTS = int(os.environ.get("NBCLUSTER_CGRAPH_MAX_BUFFERED_RESULTS", 1000))
#: Slots are this big at most; a larger value goes to a file of its own.
MAX_SLOT_BYTES = 1 << 20
_SETUP_TIMEOUT_S = 120.0


def _positive_int(name: str, value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, found {value!r}")
    return value


class CompiledDAGRef:
    """The result of one output of one execution of a compiled graph.

    ``nbcluster.get(ref)`` or ``ref.get()`` returns it (once: a second get raises
    ``ValueError``); a stage's exception is raised there, as the ``TaskError`` that is
    also an instance of the original exception. Unlike an ``ObjectRef`` it cannot be
    copied, pickled, passed to a task, or given to ``wait``. Dropping it unread frees
    its result.
    """

    __slots__ = ("_dag", "_index", "_pos", "_got", "__weakref__")

    def __init__(self, dag: CompiledDAG, index: int, pos: int) -> None:
        self._dag = dag
        self._index = index
        self._pos = pos
        self._got = False

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the result and return it.

        ``timeout`` in seconds; None means the graph's default (10 s, as in Ray), -1
        waits forever; after it, :class:`ChannelTimeoutError` (the execution goes on;
        call ``get`` again to keep waiting).
        """
        if self._got:
            raise ValueError(
                "nbcluster.get() can only be called once on a CompiledDAGRef, and it was "
                "already called."
            )
        self._got = True
        try:
            kind, value = self._dag._result(self._index, self._pos, timeout)
        except ChannelTimeoutError:
            self._got = False
            raise
        if kind == ERROR:
            raise value.as_instanceof_cause()
        return value

    def _nbcluster_get_(self, timeout: float | None) -> Any:
        """The hook ``nbcluster.get`` uses."""
        return self.get(timeout)

    def __repr__(self) -> str:
        return (
            f"CompiledDAGRef({self._dag.get_id()}, execution_index={self._index - 1}, "
            f"channel_index={self._pos})"
        )

    def __copy__(self) -> NoReturn:
        raise ValueError("CompiledDAGRef cannot be copied.")

    def __deepcopy__(self, memo: Any) -> NoReturn:
        raise ValueError("CompiledDAGRef cannot be deep copied.")

    def __reduce__(self) -> NoReturn:
        raise ValueError("CompiledDAGRef cannot be pickled: get its value and pass that.")

    def __del__(self) -> None:
        if not self._got:
            with contextlib.suppress(Exception):
                self._dag._discard(self._index, self._pos)


class CompiledDAGFuture:
    """:class:`CompiledDAGRef` for asyncio (``enable_asyncio=True``): ``await`` it once."""

    __slots__ = ("_ref",)

    def __init__(self, ref: CompiledDAGRef) -> None:
        self._ref: CompiledDAGRef | None = ref

    def __await__(self) -> Generator[Any, None, Any]:
        ref = self._ref
        if ref is None:
            raise ValueError(
                "CompiledDAGFuture can only be awaited upon once, and it has already been "
                "awaited upon."
            )
        self._ref = None
        return asyncio.to_thread(ref.get, -1).__await__()

    def __repr__(self) -> str:
        return f"CompiledDAGFuture({self._ref!r})"

    def __reduce__(self) -> NoReturn:
        raise ValueError("CompiledDAGFuture cannot be pickled.")


class CompiledDAG:
    """A graph of actor method calls compiled by ``dag.experimental_compile()``.

    ``execute(*args, **kwargs)`` runs it once and returns a :class:`CompiledDAGRef` (a
    list of them for a ``MultiOutputNode``); ``teardown()`` ends the actors' loops and
    frees the channels (also done when the object is garbage collected). While the graph
    is compiled, its actors run its calls on a thread of their own, so other calls to
    the same actors still run (and may run concurrently with the graph's).
    """

    def __init__(
        self,
        root: DAGNode,
        *,
        enable_asyncio: bool = False,
        submit_timeout: float | None = None,
        buffer_size_bytes: int | None = None,
        max_inflight_executions: int | None = None,
        max_buffered_results: int | None = None,
        channel: str = "auto",
    ) -> None:
        if channel not in ("auto", "shm", "relay"):
            raise ValueError(f"_channel must be 'auto', 'shm' or 'relay', got {channel!r}")
        self._enable_asyncio = bool(enable_asyncio)
        self._submit_timeout = submit_timeout  # execute() never blocks: kept for Ray's API
        capacity = _positive_int("buffer_size_bytes", buffer_size_bytes, DEFAULT_BUFFER_SIZE_BYTES)
        self._capacity = min(capacity, MAX_SLOT_BYTES)
        self._max_inflight = _positive_int(
            "max_inflight_executions", max_inflight_executions, DEFAULT_MAX_INFLIGHT_EXECUTIONS
        )
        self._max_buffered = _positive_int(
            "max_buffered_results", max_buffered_results, DEFAULT_MAX_BUFFERED_RESULTS
        )
        self._plan = build_plan(root)
        self._gid = uuid.uuid4().hex[:12]
        self._submit_lock = threading.Lock()
        self._read_lock = threading.RLock()  # a ref dropped while reading re-enters
        self._submitted = 0
        self._buffer: dict[tuple[int, int], tuple[int, Any]] = {}
        self._discarded: set[tuple[int, int]] = set()
        self._broken: BaseException | None = None
        self._torn_down = False
        self._readers: dict[int, Any] = {}
        self._writers: dict[int, Any] = {}
        self._directory = tempfile.mkdtemp(prefix=f"nbcg-{self._gid}-", dir=shm_root())
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._directory, True)
        try:
            self._setup(channel)
        except BaseException:
            self._abort_setup()
            raise

    # -- set-up ------------------------------------------------------------------------------
    def _actor_calls(self, fn: Any, *args: Any, timeout: float = _SETUP_TIMEOUT_S) -> list[Any]:
        handles = self._plan.handles
        refs = [handles[k].__ray_call__.remote(fn, *args) for k in self._plan.actors]
        return core.get(refs, timeout=timeout)  # type: ignore[no-any-return]

    def _setup(self, channel: str) -> None:
        plan = self._plan
        probe = os.path.join(self._directory, "probe")
        with open(probe, "w"):
            pass
        infos = dict(zip(plan.actors, self._actor_calls(_loop.probe, probe), strict=True))
        visible = {k: bool(v["visible"]) and channel != "relay" for k, v in infos.items()}
        visible[DRIVER] = True
        kinds = {
            c.cid: "shm" if all(visible[p] for p in (c.writer, *c.readers)) else "relay"
            for c in plan.channels
        }
        self._kinds = kinds
        nbytes = ring_size(self._max_inflight, self._capacity)
        for c in plan.channels:
            if kinds[c.cid] == "shm":
                create_files(self._directory, c.cid, len(c.readers), nbytes)
        transport = _loop.Transport(
            self._gid, self._directory, kinds, self._max_inflight, self._capacity
        )
        sent = plan.for_actor() if all(k == "shm" for k in kinds.values()) else plan
        for key in plan.actors:  # each actor learns its own key
            core.get(
                plan.handles[key].__ray_call__.remote(_loop.open_readers, sent, key, transport),
                timeout=_SETUP_TIMEOUT_S,
            )
        self._readers = _loop.make_readers(plan, DRIVER, transport)
        self._actor_calls(_loop.open_writers, self._gid)
        self._writers = _loop.make_writers(plan, DRIVER, transport)
        self._actor_calls(_loop.start_loop, self._gid)
        for r in self._readers.values():
            r.start()
        # Every process has its ends open: the names are no longer needed.
        os.unlink(probe)
        for c in plan.channels:
            if kinds[c.cid] == "shm":
                os.unlink(ring_path(self._directory, c.cid))
                for i in range(len(c.readers)):
                    os.unlink(fifo_path(self._directory, c.cid, i))
        self._input = self._writers[INPUT_CHANNEL]

    def _abort_setup(self) -> None:
        self._torn_down = True
        for end in (*self._writers.values(), *self._readers.values()):
            with contextlib.suppress(Exception):
                end.close()
        with contextlib.suppress(Exception):
            self._actor_calls(_loop.forget_graph, self._gid, timeout=10)
        self._finalizer()

    # -- running -------------------------------------------------------------------------------
    def get_id(self) -> str:
        """This compiled graph's id."""
        return self._gid

    def _check_usable(self) -> None:
        if self._torn_down:
            raise ChannelError("this compiled graph was torn down; compile the DAG again")
        if self._broken is not None:
            raise ChannelError(f"this compiled graph is broken: {self._broken}") from self._broken

    def _check_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inputs = DAGInput(args, kwargs)
        if self._plan.input_direct:
            inputs.single()
        for key, accessor, shown in self._plan.input_reads:
            inputs.lookup(key, accessor, shown)

    def _submit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[CompiledDAGRef]:
        self._check_usable()
        self._check_inputs(args, kwargs)
        with self._submit_lock:
            inflight = self._submitted - self._drained()
            if inflight >= self._max_inflight:
                raise CgraphCapacityExceeded(
                    f"The compiled graph can't have more than {self._max_inflight} in-flight "
                    f"executions, and you currently have {inflight} in-flight executions. "
                    "Retrieve an output using nbcluster.get before submitting more requests "
                    "or increase `_max_inflight_executions`."
                )
            try:
                self._input.write(VALUE, (args, kwargs))
            except ChannelClosed as e:
                self._diagnose(e)
            self._submitted += 1
            index = self._submitted
        return [CompiledDAGRef(self, index, pos) for pos in range(len(self._plan.outputs))]

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph once with these inputs; returns a :class:`CompiledDAGRef` (a
        list of them for a ``MultiOutputNode``) without waiting."""
        if self._enable_asyncio:
            raise ValueError("Use execute_async if enable_asyncio=True")
        refs = self._submit(args, kwargs)
        return refs if self._plan.multi_output else refs[0]

    async def execute_async(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`execute` for ``enable_asyncio=True``: gives :class:`CompiledDAGFuture` s."""
        if not self._enable_asyncio:
            raise ValueError("Use execute if enable_asyncio=False")
        futures = [CompiledDAGFuture(r) for r in self._submit(args, kwargs)]
        return futures if self._plan.multi_output else futures[0]

    def _drained(self) -> int:
        """Executions whose every output has been read from its channel."""
        return min(self._readers[c].seq for c in set(self._plan.outputs))

    def _result(self, index: int, pos: int, timeout: float | None) -> tuple[int, Any]:
        if timeout is None:
            timeout = DEFAULT_GET_TIMEOUT_S
        deadline = None if timeout < 0 else time.monotonic() + timeout
        cid = self._plan.outputs[pos]
        with self._read_lock:
            found = self._buffer.pop((index, pos), None)
            if found is not None:
                return found
            self._check_usable()
            reader = self._readers[cid]
            while reader.seq < index:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
                try:
                    item = reader.read(remaining)
                except ChannelTimeoutError:
                    if self._kinds[cid] == "relay":
                        self._check_actors()
                    raise
                except ChannelClosed as e:
                    self._diagnose(e)
                seq = reader.seq
                for p, c in enumerate(self._plan.outputs):
                    if c == cid and (seq, p) not in self._discarded:
                        if seq == index and p == pos:
                            continue
                        if len(self._buffer) >= self._max_buffered:
                            raise CgraphCapacityExceeded(
                                f"The compiled graph can't have more than {self._max_buffered} "
                                "buffered results. Retrieve the results of earlier executions "
                                "first, or increase `_max_buffered_results`."
                            )
                        self._buffer[(seq, p)] = item
                    self._discarded.discard((seq, p))
                if seq == index:
                    return item
            raise ValueError(f"the result of execution {index - 1} was already read")

    def _discard(self, index: int, pos: int) -> None:
        """A ref was dropped unread: forget its result (now, or when it is read)."""
        if self._torn_down:
            return
        with self._read_lock:
            if self._buffer.pop((index, pos), None) is None:
                cid = self._plan.outputs[pos]
                if self._readers[cid].seq < index:
                    self._discarded.add((index, pos))

    # -- failures -------------------------------------------------------------------------------
    def _check_actors(self) -> None:
        """Raise ``ActorDiedError`` if an actor of the graph is dead."""
        for key in self._plan.actors:
            ref = self._plan.handles[key].__ray_call__.remote(_loop.loop_status, self._gid)
            try:
                core.get(ref, timeout=10)
            except ActorDiedError as e:
                self._broken = e
                raise

    def _diagnose(self, cause: BaseException) -> NoReturn:
        """A channel closed under us: say which actor died or which loop failed."""
        errors = []
        for key in self._plan.actors:
            ref = self._plan.handles[key].__ray_call__.remote(_loop.loop_status, self._gid)
            try:
                status = core.get(ref, timeout=10)
            except ActorDiedError as e:
                self._broken = e
                e.add_note("(an actor of this compiled graph died; compile the DAG again)")
                raise e from cause
            except Exception as e:  # noqa: BLE001 - unreachable: report it with the rest
                errors.append(f"actor {key[:8]}: {type(e).__name__}: {e}")
                continue
            if status["error"]:
                errors.append(f"actor {key[:8]}: {status['error']}")
        detail = "; ".join(errors) or "a channel of the graph was closed"
        self._broken = ChannelError(f"the compiled graph stopped: {detail}")
        raise self._broken from cause

    # -- teardown -------------------------------------------------------------------------------
    def teardown(self) -> None:
        """End the actors' loops and free the channels. Unread results are dropped;
        ``execute`` raises afterwards. Called when the object is garbage collected."""
        if self._torn_down:
            return
        with self._submit_lock:
            if self._torn_down:
                return
            self._torn_down = True
        for w in self._writers.values():  # the end spreads downstream to the outputs
            with contextlib.suppress(Exception):
                w.close()
        deadline = time.monotonic() + DEFAULT_TEARDOWN_TIMEOUT_S
        with self._read_lock:
            for r in self._readers.values():
                with contextlib.suppress(ChannelError, OSError):
                    while True:
                        r.read(max(deadline - time.monotonic(), 0))
            for r in self._readers.values():
                with contextlib.suppress(Exception):
                    r.close()
            self._buffer.clear()
        if time.monotonic() >= deadline:
            logger.warning(
                "compiled graph %s: a stage did not finish within %ss of teardown",
                self._gid,
                DEFAULT_TEARDOWN_TIMEOUT_S,
            )
        if any(k == "relay" for k in self._kinds.values()):
            with contextlib.suppress(Exception):
                self._actor_calls(_loop.forget_graph, self._gid, timeout=10)
        self._finalizer()

    def __del__(self) -> None:
        if not getattr(self, "_torn_down", True):
            with contextlib.suppress(Exception):
                self.teardown()

    def __repr__(self) -> str:
        state = "torn down" if self._torn_down else "broken" if self._broken else "ready"
        return (
            f"<CompiledDAG {self._gid}: {len(self._plan.tasks)} calls on "
            f"{len(self._plan.actors)} actors, {state}>"
        )


def compile_dag(
    root: DAGNode,
    *,
    _submit_timeout: float | None = None,
    _buffer_size_bytes: int | None = None,
    enable_asyncio: bool = False,
    _max_inflight_executions: int | None = None,
    _max_buffered_results: int | None = None,
    _channel: str = "auto",
) -> CompiledDAG:
    """``dag.experimental_compile(...)`` (Ray's signature; see :class:`CompiledDAG`)."""
    return CompiledDAG(
        root,
        enable_asyncio=enable_asyncio,
        submit_timeout=_submit_timeout,
        buffer_size_bytes=_buffer_size_bytes,
        max_inflight_executions=_max_inflight_executions,
        max_buffered_results=_max_buffered_results,
        channel=_channel,
    )
