"""Output of every way user code runs on a worker reaches the driver, attributed to its call.

Ray prints what a task or actor method writes (stdout, stderr, ``logging``) on the driver,
prefixed ``(Class.method pid=N)``. Calls of a threaded actor (``max_concurrency > 1``) and
of an async actor run at once in one process, so each line must still go to the call
(and the submitting cell) that printed it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import nbcluster
from nbcluster import state

N = 4


class Recorder:
    """Collects (submit context, record) pairs; the context is the label of the call."""

    def __init__(self) -> None:
        self.label: Any = None
        self.lock = threading.Lock()
        self.records: list[tuple[Any, Any]] = []

    def handler(self, ctx: Any, record: Any) -> None:
        with self.lock:
            self.records.append((ctx, record))

    def lines(self, label: Any, stream: str = "stdout") -> list[str]:
        with self.lock:
            recs = [r for c, r in self.records if c == label and r.stream == stream]
        return [line for r in recs for line in r.text.splitlines()]

    def names(self) -> set[str]:
        with self.lock:
            return {r.task_name for _, r in self.records}

    def wait_for(self, label: Any, line: str, stream: str = "stdout") -> None:
        deadline = time.monotonic() + 30
        while line not in self.lines(label, stream):
            assert time.monotonic() < deadline, (line, self.records)
            time.sleep(0.05)


@pytest.fixture
def recorder(shared_cluster: Any) -> Iterator[Recorder]:
    rec = Recorder()
    state.set_output_handler(rec.handler)
    state.set_submit_context_provider(lambda: rec.label)
    try:
        yield rec
    finally:
        state.set_output_handler(None)
        state.set_submit_context_provider(None)


def _submit(rec: Recorder, method: Any, i: int) -> Any:
    rec.label = i  # the call's "cell": recorded at submission
    return method.remote(i)


def _all_named(rec: Recorder, name: str) -> bool:
    """Every record came from ``name`` (the qualified name of a class in a test function
    ends with it)."""
    names = rec.names()
    return bool(names) and all(n == name or n.endswith("." + name) for n in names)


def _assert_attributed(rec: Recorder, prefix: str) -> None:
    for i in range(N):
        rec.wait_for(i, f"{prefix} {i} end")
        rec.wait_for(i, f"{prefix} {i} stderr", "stderr")
        rec.wait_for(i, f"WARNING:root:{prefix} {i} logged", "stderr")
        assert rec.lines(i) == [f"{prefix} {i} start", f"{prefix} {i} end"]
        assert sorted(rec.lines(i, "stderr")) == sorted(
            [f"{prefix} {i} stderr", f"WARNING:root:{prefix} {i} logged"]
        )


def test_threaded_actor_calls_print_concurrently_each_to_its_own_call(recorder: Recorder):
    @nbcluster.remote(max_concurrency=N)
    class Threaded:
        def __init__(self) -> None:
            self.barrier = threading.Barrier(N, timeout=30)

        def work(self, i: int) -> int:
            print(f"threaded {i} start")
            self.barrier.wait()  # all N calls are running at once from here
            print(f"threaded {i} stderr", file=sys.stderr)
            logging.warning("threaded %d logged", i)
            self.barrier.wait()
            print(f"threaded {i} end", flush=True)
            return i

    actor = Threaded.remote()
    refs = [_submit(recorder, actor.work, i) for i in range(N)]
    assert nbcluster.get(refs, timeout=60) == list(range(N))
    _assert_attributed(recorder, "threaded")
    assert _all_named(recorder, "Threaded.work")
    nbcluster.kill(actor)


def test_async_actor_calls_print_concurrently_each_to_its_own_call(recorder: Recorder):
    @nbcluster.remote
    class Async:
        def __init__(self) -> None:
            self.started = 0
            self.all_started: asyncio.Event | None = None

        async def work(self, i: int) -> int:
            if self.all_started is None:
                self.all_started = asyncio.Event()
            print(f"async {i} start")
            self.started += 1
            if self.started == N:
                self.all_started.set()
            await asyncio.wait_for(self.all_started.wait(), 30)  # N calls interleave
            # a helper thread and a child asyncio task of the call print for the call too
            await asyncio.to_thread(print, f"async {i} stderr", file=sys.stderr)
            await asyncio.create_task(self._log(i))
            print(f"async {i} end")
            return i

        async def _log(self, i: int) -> None:
            await asyncio.sleep(0.01)
            logging.warning("async %d logged", i)

    actor = Async.remote()
    refs = [_submit(recorder, actor.work, i) for i in range(N)]
    assert nbcluster.get(refs, timeout=60) == list(range(N))
    _assert_attributed(recorder, "async")
    assert _all_named(recorder, "Async.work")
    nbcluster.kill(actor)


def test_tasks_and_sync_actor_calls_still_send_their_output(recorder: Recorder):
    @nbcluster.remote
    def task(i: int) -> int:
        print(f"task {i} start")
        # a thread the task starts: its output belongs to the task
        t = threading.Thread(target=print, args=(f"task {i} stderr",), kwargs={"file": sys.stderr})
        t.start()
        t.join()
        logging.warning("task %d logged", i)
        print(f"task {i} end")
        return i

    @nbcluster.remote
    class Sync:
        def work(self, i: int) -> int:
            print(f"sync {i} start")
            print(f"sync {i} stderr", file=sys.stderr)
            logging.warning("sync %d logged", i)
            print(f"sync {i} end")
            return i

    refs = [_submit(recorder, task, i) for i in range(N)]
    assert nbcluster.get(refs, timeout=60) == list(range(N))
    _assert_attributed(recorder, "task")
    recorder.records.clear()
    actor = Sync.remote()
    refs = [_submit(recorder, actor.work, i) for i in range(N)]
    assert nbcluster.get(refs, timeout=60) == list(range(N))
    _assert_attributed(recorder, "sync")
    assert _all_named(recorder, "Sync.work")
    nbcluster.kill(actor)


def test_default_printing_prefixes_actor_output_with_class_method_and_pid(
    shared_cluster: Any, capsys: pytest.CaptureFixture[str]
):
    @nbcluster.remote(max_concurrency=2)
    class Printer:
        def pid(self) -> int:
            import os

            return os.getpid()

        async def hello(self) -> None:
            print("hello from an async method")

    actor = Printer.remote()
    pid = nbcluster.get(actor.pid.remote(), timeout=60)
    nbcluster.get(actor.hello.remote(), timeout=60)
    deadline = time.monotonic() + 30
    out = ""
    while "hello from" not in out and time.monotonic() < deadline:
        time.sleep(0.05)
        out += capsys.readouterr().out
    assert f"Printer.hello pid={pid}) hello from an async method\n" in out
    nbcluster.kill(actor)
