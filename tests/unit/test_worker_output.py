"""Task output capture in a worker: buffers, folding, and a flusher that never polls."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nbcluster._runtime.worker import output
from nbcluster._runtime.worker.output import OutputCapture, Wakeup, flush_forever


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, list[tuple[str, str, int]]]] = []

    def send_logs(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        self.sent.append((task_id, chunks))


def test_writes_outside_a_task_are_not_captured() -> None:
    cap = OutputCapture()
    assert cap.write("stdout", "hello\n") is False
    assert cap.drain() == []


def test_a_task_output_is_buffered_and_folded_beyond_the_limits() -> None:
    cap = OutputCapture()
    sink = Sink()
    slot = cap.begin(b"t1", sink)
    for i in range(output.MAX_LINES_PER_FLUSH + 50):
        assert cap.write("stdout", f"line {i}\n")
    cap.write("stderr", "oops\n")
    ((task_id, got_sink, chunks),) = cap.drain()
    assert task_id == b"t1" and got_sink is sink
    (out_name, out_text, dropped), (err_name, err_text, err_dropped) = chunks
    assert (out_name, err_name) == ("stdout", "stderr")
    assert out_text.count("\n") == output.MAX_LINES_PER_FLUSH and dropped == 50
    assert (err_text, err_dropped) == ("oops\n", 0)
    cap.write("stdout", "after\n")
    assert cap.end(slot) == (b"t1", sink, [("stdout", "after\n", 0)])
    assert cap.write("stdout", "no task\n") is False


def test_only_the_first_write_into_empty_buffers_wakes_the_flusher() -> None:
    cap = OutputCapture()
    calls = []
    cap.wakeup.set = lambda: calls.append(1)  # type: ignore[method-assign]
    cap.begin(b"t", Sink())
    cap.write("stdout", "a")
    cap.write("stdout", "b")
    cap.write("stderr", "c")
    assert calls == [1]
    cap.drain()
    cap.write("stdout", "d")
    assert calls == [1, 1]


def test_wakeup_set_before_the_waiter_and_from_other_threads() -> None:
    async def main() -> None:
        w = Wakeup()
        w.set()  # before anyone waits: not lost
        await asyncio.wait_for(w.wait(), 1)
        waiter = asyncio.ensure_future(w.wait())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        t = threading.Thread(target=lambda: [w.set() for _ in range(5)])
        t.start()
        t.join()
        await asyncio.wait_for(waiter, 1)
        again = asyncio.ensure_future(w.wait())  # the five sets were one wake-up
        await asyncio.sleep(0.02)
        assert not again.done()
        again.cancel()

    asyncio.run(main())


def test_the_flusher_sends_what_is_written_and_sleeps_while_nothing_is() -> None:
    async def main() -> None:
        cap = OutputCapture()
        sink = Sink()
        wakeups = 0
        real_wait = cap.wakeup.wait

        async def counting_wait() -> None:
            nonlocal wakeups
            await real_wait()
            wakeups += 1

        cap.wakeup.wait = counting_wait  # type: ignore[method-assign]
        flusher = asyncio.ensure_future(flush_forever(cap, interval=0.01))
        await asyncio.sleep(0.1)
        assert wakeups == 0 and sink.sent == []  # idle: not one wake-up
        cap.begin(b"t", sink)
        threading.Thread(target=cap.write, args=("stdout", "from a thread\n")).start()
        for _ in range(100):
            if sink.sent:
                break
            await asyncio.sleep(0.01)
        assert sink.sent == [(b"t", [("stdout", "from a thread\n", 0)])]
        await asyncio.sleep(0.1)
        assert wakeups == 1  # and idle again
        flusher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flusher

    asyncio.run(main())


def test_an_unfinished_line_waits_for_its_newline_until_the_call_ends() -> None:
    cap = OutputCapture()
    sink = Sink()
    slot = cap.begin(b"t", sink)
    cap.write("stdout", "a line")  # print() writes the text, then the newline
    assert cap.drain() == []
    cap.write("stdout", "\n")
    cap.write("stdout", "half")
    assert cap.drain() == [(b"t", sink, [("stdout", "a line\n", 0)])]
    assert cap.end(slot) == (b"t", sink, [("stdout", "half", 0)])


def test_concurrent_calls_in_threads_each_get_their_own_output() -> None:
    cap = OutputCapture()
    sinks = {i: Sink() for i in range(4)}
    barrier = threading.Barrier(4)
    ended: dict[int, tuple[bytes, object, list[tuple[str, str, int]]]] = {}

    def call(i: int) -> None:
        slot = cap.begin(bytes([i]), sinks[i])
        barrier.wait()  # all four calls are running
        cap.write("stdout", f"from {i}\n")
        barrier.wait()
        ended[i] = cap.end(slot)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert ended[i] == (bytes([i]), sinks[i], [("stdout", f"from {i}\n", 0)])
    assert cap.task_id == b"" and cap.write("stdout", "late\n") is False


def test_concurrent_asyncio_calls_and_their_helpers_are_told_apart() -> None:
    cap = OutputCapture()

    async def call(i: int) -> tuple[bytes, object, list[tuple[str, str, int]]]:
        slot = cap.begin(bytes([i]), None)
        await asyncio.sleep(0)
        cap.write("stdout", f"{i} on the loop\n")
        await asyncio.to_thread(cap.write, "stderr", f"{i} in a helper thread\n")
        await asyncio.create_task(asyncio.sleep(0))
        return cap.end(slot)

    async def main() -> list[tuple[bytes, object, list[tuple[str, str, int]]]]:
        return await asyncio.gather(*(call(i) for i in range(3)))

    for i, got in enumerate(asyncio.run(main())):
        assert got == (
            bytes([i]),
            None,
            [("stdout", f"{i} on the loop\n", 0), ("stderr", f"{i} in a helper thread\n", 0)],
        )


def test_a_thread_outside_any_call_writes_to_the_latest_running_call() -> None:
    cap = OutputCapture()
    sink = Sink()
    slot = cap.begin(b"t", sink)
    t = threading.Thread(target=cap.write, args=("stdout", "from a user thread\n"))
    t.start()
    t.join()
    assert cap.end(slot) == (b"t", sink, [("stdout", "from a user thread\n", 0)])


def test_display_outputs_keep_their_place_among_the_prints() -> None:
    cap = OutputCapture()
    sink = Sink()
    assert cap.display('{"data": {}}') is False, "no call runs"
    slot = cap.begin(b"t", sink)
    assert cap.running()
    cap.write("stdout", "before\n")
    cap.write("stderr", "warned\n")
    assert cap.display("B1")
    cap.write("stdout", "between\n")
    assert cap.display("B2")
    cap.write("stdout", "after")
    assert cap.drain() == [
        (
            b"t",
            sink,
            [
                ("stdout", "before\n", 0),
                ("stderr", "warned\n", 0),
                (output.DISPLAY_STREAM, "B1", 0),
                ("stdout", "between\n", 0),
                (output.DISPLAY_STREAM, "B2", 0),
            ],
        )
    ]
    assert cap.end(slot) == (b"t", sink, [("stdout", "after", 0)])
    assert not cap.running()


def test_displays_beyond_the_limit_are_counted_as_folded() -> None:
    cap = OutputCapture()
    slot = cap.begin(b"t", Sink())
    for i in range(output.MAX_DISPLAYS_PER_FLUSH + 7):
        assert cap.display(f"B{i}")
    ((_, _, chunks),) = cap.drain()
    shown = [c for c in chunks if c[1]]
    assert [c[1] for c in shown] == [f"B{i}" for i in range(output.MAX_DISPLAYS_PER_FLUSH)]
    assert chunks[-1] == (output.DISPLAY_STREAM, "", 7)
    cap.display("next interval")  # the limit is per flush interval
    assert cap.end(slot)[2] == [(output.DISPLAY_STREAM, "next interval", 0)]
