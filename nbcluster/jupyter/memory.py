"""Memory a person can act on: release a variable's refs, and a policy for ``Out[n]``.

An object lives in the cluster while this notebook holds a ref to it. Two places hold refs
without the user seeing them:

- variables: ``x = f.remote()`` keeps ``x``'s object alive until ``x`` is deleted. The
  object-store widget lists the variables that hold the largest objects and has a
  release button for each: :func:`release_variable` deletes the variable (and IPython's
  output-cache entries holding the same value), and :func:`freed_bytes` measures what the
  cluster freed.
- IPython's output history: a cell whose last line is a ref (or a list of them) leaves
  it in ``Out[n]`` and ``_n`` (and ``_``, ``__``, ``___``) for good. The **output-ref
  policy** (``%cluster out-refs``) clears those refs automatically after every cell:

  ===============  =======================================================================
  ``last N``       keep the refs of the ``N`` most recent outputs that hold any; drop the
                   older ones (the default, with ``N`` = 10)
  ``clear``        drop them after every cell (the output stays shown; ``Out[n]`` is gone)
  ``keep``         never drop them (IPython's own behaviour)
  ===============  =======================================================================

  An output "holds refs" when it is an :class:`~nbcluster.ObjectRef` or a list, tuple or
  dict with one (one level deep, as :func:`~nbcluster.jupyter.widgets.find_ref_names`
  looks). Dropping removes ``Out[n]`` and ``_n``, and ``_``/``__``/``___`` when they are
  the same object; nothing else (variables are the user's). IPython also keeps the last
  cell's result until the next cell runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from nbcluster import state
from nbcluster._refs import ObjectRef

__all__ = [
    "DEFAULT_OUT_POLICY",
    "OutPolicy",
    "apply_out_policy",
    "freed_bytes",
    "holds_refs",
    "parse_out_policy",
    "release_variable",
]

_OUT_NAME = re.compile(r"Out\[(\d+)\]")
_NUMBERED = re.compile(r"_(\d+)")
_ALIASES = ("_", "__", "___")


def holds_refs(value: Any, max_items: int = 10_000) -> bool:
    """True when ``value`` is an ObjectRef, or a list, tuple or dict holding one."""
    if isinstance(value, ObjectRef):
        return True
    if isinstance(value, list | tuple):
        return any(isinstance(v, ObjectRef) for v in value[:max_items])
    if isinstance(value, dict):
        values = itertools.islice(value.values(), max_items)
        return any(isinstance(v, ObjectRef) for v in values)
    return False


def _drop_aliases(ns: MutableMapping[str, Any], value: Any, shell: Any) -> None:
    """``_``, ``__``, ``___`` that are ``value`` become ``""`` (as IPython empties them):
    in the namespace, in IPython's hidden namespace and in its display hook."""
    hidden = getattr(shell, "user_ns_hidden", None)
    displayhook = getattr(shell, "displayhook", None)
    for alias in _ALIASES:
        if ns.get(alias) is value:
            ns[alias] = ""
        if isinstance(hidden, dict) and hidden.get(alias) is value:
            hidden[alias] = ""
        if displayhook is not None and getattr(displayhook, alias, None) is value:
            setattr(displayhook, alias, "")


def _drop_output(ns: MutableMapping[str, Any], n: int, shell: Any = None) -> bool:
    out = ns.get("Out")
    value = out.pop(n, None) if isinstance(out, dict) else None
    numbered = ns.pop(f"_{n}", None)
    hidden = getattr(shell, "user_ns_hidden", None)
    if isinstance(hidden, dict):
        hidden.pop(f"_{n}", None)
    value = value if value is not None else numbered
    if value is None:
        return False
    _drop_aliases(ns, value, shell)
    return True


def release_variable(ns: MutableMapping[str, Any], name: str, shell: Any = None) -> list[str]:
    """Drop the notebook's reference called ``name``; return the names removed.

    ``name`` is what the object-store widget shows: a variable (``x``), an item of one
    (``refs[3]``: the whole variable ``refs`` goes), or an output (``Out[7]``/``_7``).
    Raises ``KeyError`` when there is no such name.
    """
    m = _OUT_NAME.fullmatch(name) or _NUMBERED.fullmatch(name)
    if m:
        n = int(m.group(1))
        if not _drop_output(ns, n, shell):
            raise KeyError(f"no output {name} to release")
        return [f"Out[{n}]", f"_{n}"]
    top = name.split("[", 1)[0]
    if not top.isidentifier() or top not in ns:
        raise KeyError(f"no variable {top!r} to release")
    value = ns.pop(top)
    removed = [top]
    _drop_aliases(ns, value, shell)
    out = ns.get("Out")
    if isinstance(out, dict):
        for n, v in list(out.items()):
            if v is value and _drop_output(ns, n, shell):
                removed.append(f"Out[{n}]")
    return removed


def freed_bytes(
    before: dict[str, int],
    *,
    timeout: float = 3.0,
    settle: float = 0.3,
    owned: Callable[[], Iterable[state.ObjectInfo]] = state.owned_objects,
) -> int:
    """Bytes of the objects in ``before`` (id → size) that this driver no longer owns.

    Refs are freed asynchronously: it waits until the set of owned objects has not shrunk
    for ``settle`` seconds (or ``timeout`` passed).
    """
    deadline = time.monotonic() + timeout
    last: set[str] | None = None
    stable_since = time.monotonic()
    while True:
        now_ids = {o.object_id for o in owned()}
        gone = set(before) - now_ids
        if gone != last:
            last, stable_since = gone, time.monotonic()
        elif time.monotonic() - stable_since >= settle or time.monotonic() >= deadline:
            return sum(before[oid] for oid in gone)
        time.sleep(0.05)


@dataclasses.dataclass(frozen=True)
class OutPolicy:
    """What happens to refs in ``Out[n]`` (see the module docstring)."""

    mode: str  # "keep", "clear" or "last"
    keep: int = 0

    def __str__(self) -> str:
        return f"last {self.keep}" if self.mode == "last" else self.mode

    def describe(self) -> str:
        """One sentence for ``%cluster out-refs``."""
        if self.mode == "keep":
            return "outputs keep their refs (Out[n] holds them until you delete it)"
        if self.mode == "clear":
            return "refs in outputs are dropped after every cell"
        return f"the {self.keep} most recent outputs keep their refs; older ones are dropped"


DEFAULT_OUT_POLICY = OutPolicy("last", 10)


def parse_out_policy(words: list[str]) -> OutPolicy:
    """``["keep"]``, ``["clear"]`` or ``["last", "N"]`` → an :class:`OutPolicy`."""
    if words == ["keep"]:
        return OutPolicy("keep")
    if words == ["clear"]:
        return OutPolicy("clear")
    if len(words) == 2 and words[0] == "last" and words[1].isdigit() and int(words[1]) >= 1:
        return OutPolicy("last", int(words[1]))
    raise ValueError(
        f"not an output-ref policy: {' '.join(words)!r}; use keep, clear or last N (N >= 1)"
    )


def apply_out_policy(
    ns: MutableMapping[str, Any], policy: OutPolicy, shell: Any = None
) -> list[int]:
    """Drop the ``Out[n]`` entries the policy no longer keeps; return their numbers.

    ``shell``: the IPython shell, whose display hook and hidden namespace hold the latest
    outputs too.
    """
    if policy.mode == "keep":
        return []
    out = ns.get("Out")
    if not isinstance(out, dict):
        return []
    holding = sorted(n for n, v in list(out.items()) if isinstance(n, int) and holds_refs(v))
    doomed = holding if policy.mode == "clear" else holding[: max(0, len(holding) - policy.keep)]
    return [n for n in doomed if _drop_output(ns, n, shell)]
