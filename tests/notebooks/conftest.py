"""The tutorial run times, printed at the end of every pytest run that executed a tutorial."""

from __future__ import annotations

from typing import Any

import pytest

#: notebook name -> seconds its execution took (filled by test_tutorials.py).
RUN_TIMES: dict[str, float] = {}


@pytest.fixture
def record_run_time() -> Any:
    """``record_run_time(name, seconds)``: keep a tutorial's run time for the summary."""

    def record(name: str, seconds: float) -> None:
        RUN_TIMES[name] = seconds

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A table of tutorial run times (the acceptance bound is 60 s each)."""
    if not RUN_TIMES:
        return
    terminalreporter.section("tutorial run times (bound: 60 s each)")
    for name, seconds in sorted(RUN_TIMES.items()):
        terminalreporter.write_line(f"{name:45s} {seconds:6.1f} s")
