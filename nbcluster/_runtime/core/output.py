"""What a driver does with its tasks' output by default: print it, as Ray does."""

from __future__ import annotations

import json
import sys
from typing import Any

from nbcluster._runtime.worker import display_hook

__all__ = ["display_text", "print_task_output"]


def print_task_output(context: Any, name: str, record: Any) -> None:
    """Default output handler: print with a ``(name pid=N)`` prefix, as Ray does."""
    out = sys.stderr if record.stream == "stderr" else sys.stdout
    prefix = f"({name} pid={record.pid}) "
    text = record.text
    if record.stream == "display":  # a rich display() from the task
        if text and display_hook.forward(text):
            return  # on a worker, inside a task: passed on to that task's owner, still rich
        text = display_text(text, record.dropped_lines)
        if text:
            out.write("".join(prefix + line for line in text.splitlines(keepends=True)))
        out.flush()
        return
    if text:
        lines = text.splitlines(keepends=True)
        out.write("".join(prefix + line for line in lines))
        if not text.endswith("\n"):
            out.write("\n")
    if record.dropped_lines:
        out.write(
            f"{prefix}[... {record.dropped_lines} more lines folded by the output rate limit ...]\n"
        )
    out.flush()


def display_text(text: str, dropped: int = 0) -> str:
    """The ``text/plain`` of a display record (JSON ``{"data", "metadata"}``), one line
    per line, and a note of the display outputs folded by the rate limit."""
    out = ""
    if text:
        try:
            plain = json.loads(text)["data"]["text/plain"]
        except (ValueError, KeyError, TypeError):
            plain = "<display output>"
        out = str(plain) if str(plain).endswith("\n") else f"{plain}\n"
    if dropped:
        out += f"[... {dropped} more display outputs folded by the output rate limit ...]\n"
    return out
