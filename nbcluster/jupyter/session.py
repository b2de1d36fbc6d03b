"""Sessions that resume: a notebook's named actors and kept results outlive its kernel.

``%cluster connect ADDRESS --session NAME`` joins a cluster that outlives the kernel (a head
started with ``nbcluster start``, or client mode with ``nbcluster://HOST:PORT``) under the
namespace ``NAME`` (in client mode, give actors ``namespace=NAME`` yourself: the proxy
driver has its own). What the notebook wants back after a kernel restart, a laptop sleep or
a network change it gives a name:

- **actors**: named, detached actors of the session's namespace
  (``Cls.options(name="model", lifetime="detached").remote()``): a non-detached actor ends
  with the kernel that made it, as in Ray;
- **results**: :func:`keep` (or ``%cluster keep VAR ...``) copies a value, or the value of
  a ref, into the session's store: a detached actor of the namespace
  (``__nbcluster_session__``) that puts each value in the object store itself, so the
  object is owned by the store and survives the kernel.

Connecting again with the same session name (:func:`resume`) puts each of them back into
the notebook's namespace under its name (an actor handle, or a ref to the kept value) and
says which. :func:`forget` drops a kept result; killing the store actor
(``nbcluster.kill(nbcluster.get_actor("__nbcluster_session__", namespace=NAME))``) ends the
session's results.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from typing import Any

import nbcluster
from nbcluster import ObjectRef, state

__all__ = [
    "STORE_NAME",
    "SessionStore",
    "current",
    "forget",
    "keep",
    "kept",
    "named_actors",
    "resume",
    "use",
]

#: The name of the store actor in the session's namespace.
STORE_NAME = "__nbcluster_session__"


@nbcluster.remote(num_cpus=0, max_restarts=0)
class SessionStore:
    """Holds the results a session kept: each is put into the object store by this actor,
    which owns it, so it lives as long as the store (a detached actor)."""

    def __init__(self) -> None:
        self.refs: dict[str, Any] = {}

    def keep(self, name: str, value: Any) -> int:
        """Keep ``value`` under ``name`` (replacing what had the name); return its size."""
        self.refs[name] = [nbcluster.put(value)]  # in a list: handed out as a ref, not a value
        return len(self.refs)

    def get(self, name: str) -> list[Any]:
        """``[ref]`` to the value kept as ``name`` (KeyError when there is none)."""
        return self.refs[name]

    def names(self) -> list[str]:
        """What is kept, oldest first."""
        return list(self.refs)

    def forget(self, name: str) -> bool:
        """Drop ``name``; True when it was kept."""
        return self.refs.pop(name, None) is not None


_store_lock = threading.Lock()
_session: dict[str, str] = {}


def use(name: str | None) -> None:
    """Make ``name`` this kernel's session (None: no session)."""
    if name is None:
        _session.pop("name", None)
    elif not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"a session name is letters, digits, '-', '_' and '.', got {name!r}")
    else:
        _session["name"] = name


def current() -> str | None:
    """This kernel's session name, or None."""
    return _session.get("name")


def _namespace() -> str:
    ns = _session.get("name")
    if not ns:
        raise RuntimeError(
            "this kernel has no session: connect with %cluster connect ADDRESS --session NAME"
        )
    return ns


def _store(create: bool) -> Any:
    ns = _namespace()
    with _store_lock:
        try:
            return nbcluster.get_actor(STORE_NAME, namespace=ns)
        except ValueError:
            if not create:
                return None
            return SessionStore.options(
                name=STORE_NAME, namespace=ns, lifetime="detached", get_if_exists=True
            ).remote()


def keep(name: str, value: Any) -> None:
    """Keep ``value`` (or the value of a ref) in this session under ``name``."""
    if not name.isidentifier():
        raise ValueError(f"a kept result needs a name that is a Python identifier, got {name!r}")
    store = _store(create=True)
    nbcluster.get(store.keep.remote(name, value))


def kept() -> list[str]:
    """The names of the results this session keeps."""
    store = _store(create=False)
    return [] if store is None else list(nbcluster.get(store.names.remote()))


def forget(name: str) -> bool:
    """Stop keeping ``name``; True when it was kept."""
    store = _store(create=False)
    return bool(store is not None and nbcluster.get(store.forget.remote(name)))


def named_actors(timeout: float = 10.0) -> list[str]:
    """Names of the live actors of this session's namespace (read from the head)."""
    ns = _namespace()
    got: list[Any] = []
    sub = state.subscribe_events(got.append, kinds=("actor",))
    try:
        if not sub.wait_ready(timeout):
            raise TimeoutError(f"the head did not list its actors within {timeout}s")
    finally:
        sub.close()
    snapshot = next((b for b in got if b.snapshot), None)
    names = []
    for e in snapshot.events if snapshot else ():
        a = e.data
        if a.namespace == ns and a.name and a.name != STORE_NAME and a.state != "DEAD":
            names.append(a.name)
    return sorted(set(names))


def resume(user_ns: MutableMapping[str, Any]) -> dict[str, list[str]]:
    """Put the session's named actors and kept results back into ``user_ns``.

    Returns ``{"actors": [...], "results": [...], "skipped": [...]}``: names already bound
    in the namespace, or not Python identifiers, are skipped (left as they are).
    """
    ns = _namespace()
    out: dict[str, list[str]] = {"actors": [], "results": [], "skipped": []}
    for name in named_actors():
        if not name.isidentifier() or name in user_ns:
            out["skipped"].append(name)
            continue
        user_ns[name] = nbcluster.get_actor(name, namespace=ns)
        out["actors"].append(name)
    store = _store(create=False)
    if store is not None:
        for name in nbcluster.get(store.names.remote()):
            if name in user_ns:
                out["skipped"].append(name)
                continue
            (ref,) = nbcluster.get(store.get.remote(name))
            assert isinstance(ref, ObjectRef)
            user_ns[name] = ref
            out["results"].append(name)
    return out
