"""Placeholders for top-level ref arguments inside a serialized ``(args, kwargs)``."""

from __future__ import annotations

from typing import Any

from nbcluster._runtime.serialization import register_plain_type


class ArgPlaceholder:
    """Stands for the i-th top-level ref argument; the worker swaps in its value."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArgPlaceholder, (self.index,))

    def __repr__(self) -> str:
        return f"ArgPlaceholder({self.index})"


register_plain_type(ArgPlaceholder)  # a call's (args, kwargs) stays on the fast path
