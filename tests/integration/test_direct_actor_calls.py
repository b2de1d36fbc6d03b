"""A plain sync actor's calls are read and answered by its worker's main thread
(worker/direct.py): real cluster, real sockets. (Task leases' channels: test_direct_tasks.py.)"""

from __future__ import annotations

import sys
import threading
from typing import Any

import cloudpickle

import nbcluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


def _direct_view() -> dict[str, Any]:
    """Inside an actor call: which thread runs it, whether it came on a channel the main
    thread reads, and how many actor channels the main thread serves."""
    from nbcluster._runtime import context
    from nbcluster._runtime.worker.direct import DirectStream

    executor = context.require_client().executor  # type: ignore[attr-defined]
    direct = executor.direct
    channels = 0
    if direct is not None:
        channels = sum(
            isinstance(key.data, DirectStream) and not key.data.lease
            for key in direct._selector.get_map().values()
        )
    return {
        "main_thread": threading.current_thread() is threading.main_thread(),
        "direct": isinstance(executor.running_stream, DirectStream),
        "channels": channels,
    }


@nbcluster.remote
class Plain:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def view(self) -> dict[str, Any]:
        return _direct_view()

    def add(self, i: int) -> int:
        self.seen.append(i)
        return i

    def seen_list(self) -> list[int]:
        return list(self.seen)


@nbcluster.remote(max_concurrency=2)
class Threaded:
    def view(self) -> dict[str, Any]:
        return _direct_view()


@nbcluster.remote
class Async:
    async def view(self) -> dict[str, Any]:
        return _direct_view()


@nbcluster.remote
def call_from_a_task(actor: Any, base: int, n: int) -> list[int]:
    return nbcluster.get([actor.add.remote(base + i) for i in range(n)], timeout=60)


def test_a_plain_sync_actor_serves_its_callers_channels_on_its_main_thread(
    shared_cluster: Any,
) -> None:
    actor = Plain.remote()
    view = nbcluster.get(actor.view.remote(), timeout=60)
    assert view == {"main_thread": True, "direct": True, "channels": 1}
    # A second caller (a task in another worker) gets a channel of its own.
    assert nbcluster.get(call_from_a_task.remote(actor, 1000, 3), timeout=60) == [1000, 1001, 1002]
    assert nbcluster.get(actor.view.remote(), timeout=60)["channels"] == 2
    nbcluster.kill(actor)


@nbcluster.remote
class SlowToSwitch:
    """A plain actor whose main thread is slow to start serving its channels: its
    ``__init__`` (on the main thread, before the creation is answered) makes building a
    direct loop take 0.3 s, the stall a loaded machine can put there. (The main thread now
    serves from the worker's start, so no loop is built after the creation; the caller must
    still be adopted.)"""

    def __init__(self) -> None:
        import time

        from nbcluster._runtime.worker.direct import DirectLoop

        build = DirectLoop.__init__

        def slow(direct: Any, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.3)
            build(direct, *args, **kwargs)

        DirectLoop.__init__ = slow  # type: ignore[method-assign]  # this worker is the actor's

    def view(self) -> dict[str, Any]:
        return _direct_view()

    def add(self, i: int) -> int:
        return i


def test_a_caller_that_connects_the_moment_the_actor_is_alive_is_served_directly(
    shared_cluster: Any,
) -> None:
    # The main thread takes the actor's channels before the creation is answered: a caller
    # that connects as soon as the head says ALIVE (it knows the channel's address from the
    # head's record) is adopted, not left on the I/O loop (CI once saw channels == 0).
    actor = SlowToSwitch.remote()
    view = nbcluster.get(actor.view.remote(), timeout=60)
    assert view == {"main_thread": True, "direct": True, "channels": 1}
    assert nbcluster.get([actor.add.remote(i) for i in range(5)], timeout=60) == list(range(5))
    nbcluster.kill(actor)


def test_threaded_and_async_actors_stay_on_the_io_loop(shared_cluster: Any) -> None:
    for cls in (Threaded, Async):
        actor = cls.remote()
        view = nbcluster.get(actor.view.remote(), timeout=60)
        assert view["direct"] is False and view["channels"] == 0, cls
        nbcluster.kill(actor)


def test_bursts_from_two_callers_keep_each_callers_order(shared_cluster: Any) -> None:
    actor = Plain.remote()
    n = 2000
    from_task = call_from_a_task.remote(actor, 100_000, 500)
    refs = [actor.add.remote(i) for i in range(n)]
    assert nbcluster.get(refs, timeout=120) == list(range(n))
    assert nbcluster.get(from_task, timeout=120) == list(range(100_000, 100_500))
    seen = nbcluster.get(actor.seen_list.remote(), timeout=60)
    assert [i for i in seen if i < n] == list(range(n))
    assert [i for i in seen if i >= 100_000] == list(range(100_000, 100_500))
    nbcluster.kill(actor)
