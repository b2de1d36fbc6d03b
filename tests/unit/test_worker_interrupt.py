"""A worker's SIGINT handler (``Executor.interrupt``): a cancel's SIGINT raises only while
a task's own code runs, so one that lands after the code ended cannot lose the reply."""

from __future__ import annotations

import signal
import threading
import types
from typing import Any

import pytest

from nbcluster._runtime.worker.main import Executor


def _executor() -> Executor:
    client: Any = types.SimpleNamespace(config=types.SimpleNamespace())
    return Executor(client)


def test_the_handler_raises_only_while_task_code_runs() -> None:
    ex = _executor()
    assert not ex.interruptible  # no task yet
    ex.interrupt(signal.SIGINT, None)  # dropped
    ex.interruptible = True
    with pytest.raises(KeyboardInterrupt):
        ex.interrupt(signal.SIGINT, None)


def test_a_real_sigint_after_the_code_ended_is_dropped() -> None:
    ex = _executor()
    previous = signal.signal(signal.SIGINT, ex.interrupt)
    try:
        ex.interruptible = True
        with pytest.raises(KeyboardInterrupt):  # lands in the "task's code"
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            for _ in range(1000):  # the handler runs at the next check of the eval loop
                pass
        ex.interruptible = False
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        for _ in range(1000):
            pass  # the handler ran here, and raised nothing
    finally:
        signal.signal(signal.SIGINT, previous)
