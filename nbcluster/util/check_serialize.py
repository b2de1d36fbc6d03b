"""``inspect_serializability``: find what keeps an object from being serialized (Ray's
``ray.util.check_serialize``)."""

from __future__ import annotations

import io
import re
from typing import Any

from nbcluster._runtime.serialization import _children, make_pickler

__all__ = ["FailureTuple", "inspect_serializability"]


class FailureTuple:
    """One object that cannot be serialized: ``obj``, its ``name`` and its ``parent``."""

    __slots__ = ("obj", "name", "parent")

    def __init__(self, obj: Any, name: str, parent: Any) -> None:
        self.obj = obj
        self.name = name
        self.parent = parent

    def __repr__(self) -> str:
        return f"FailTuple({self.name} [obj={self.obj!r}, parent={self.parent!r}])"


def _pickle_error(obj: Any) -> BaseException | None:
    try:
        with io.BytesIO() as file:
            make_pickler(file, lambda _buf: None).dump(obj)
    except Exception as exc:  # noqa: BLE001 - any failure means "not serializable"
        return exc
    return None


def inspect_serializability(
    base_obj: Any, name: str | None = None, depth: int = 3, print_file: Any | None = None
) -> tuple[bool, set[FailureTuple]]:
    """Say whether ``base_obj`` serializes, and if not which parts prevent it.

    Walks into what pickling would pickle (closure variables and globals of functions,
    attributes of objects, items of containers) up to ``depth`` levels, printing a short
    report to ``print_file`` (stdout by default).

    Returns:
        ``(True, set())`` when it serializes; otherwise ``(False, failures)`` with one
        :class:`FailureTuple` for each innermost part that cannot be serialized.
    """
    if name is None:
        name = getattr(base_obj, "__qualname__", None) or type(base_obj).__name__
    failures: set[FailureTuple] = set()
    seen: set[int] = set()

    def say(text: str, level: int) -> None:
        print("    " * level + text, file=print_file)

    def walk(obj: Any, obj_name: str, parent: Any, level: int) -> bool:
        seen.add(id(obj))
        err = _pickle_error(obj)
        if err is None:
            return True
        say(f"!!! FAIL serialization of {obj_name}: {type(err).__name__}: {err}", level)
        found = False
        if level < depth:
            for suffix, child in _children(obj):
                if id(child) in seen:
                    continue
                quoted = re.search(r"'([^']*)'", suffix)  # " (global 'lock')" -> lock
                child_name = quoted.group(1) if quoted else suffix.strip(" ().[]") or suffix
                if not walk(child, child_name, obj, level + 1):
                    found = True
        if not found:  # nothing inside fails alone: this part is the culprit
            failures.add(FailureTuple(obj, obj_name, parent))
        return False

    say("=" * 60, 0)
    say(f"Checking serializability of {name}", 0)
    ok = walk(base_obj, name, None, 0)
    if ok:
        say(f"{name} is serializable", 0)
    else:
        say(f"Variables that cannot be serialized: {failures}", 0)
    say("=" * 60, 0)
    return ok, failures
