"""Sessions that resume: a notebook's named actors and kept results outlive its kernel.

``%cluster connect ADDRESS --session NAME`` joins a cluster that outlives the kernel (a head
started with ``nbcluster start``, or client mode with ``nbcluster://HOST:PORT``) under the
namespace ``NAME`` (in client mode, give actors ``namespace=NAME`` yourself: the proxy
driver has its own). What the notebook wants back after a kernel restart, a laptop sleep or
a network change it gives a name:

- **actors**: named, detached actors of the session's namespace
  (``Cls.options(name="model", lifetime="detached").remote()``): a non-detached actor ends
  with the kernel that made it, as in Ray;
- **results**: ``nbcluster.put(value, name="...")`` and :func:`keep` (or ``%cluster keep
  VAR ...``) put a value, or the value of a ref, into the session's store: a detached
  actor of the namespace (``__nbcluster_session__``, :mod:`nbcluster._named`) that puts
  each value in the object store itself, so the object is owned by the store and
  survives the kernel. ``put(name=)`` keeps a name once (putting it again is an error);
  ``keep`` replaces.

Connecting again with the same session name (:func:`resume`) puts each of them back into
the notebook's namespace under its name (an actor handle, or a ref to the kept value) and
says which; a result whose name is not a Python identifier is not bound, and
``nbcluster.get_named(name)`` returns it (from any process of the session).
:func:`forget` drops a kept result; killing the store actor
(``nbcluster.kill(nbcluster.get_actor("__nbcluster_session__", namespace=NAME))``) ends the
session's results.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from nbcluster import _actor, _named, state
from nbcluster._named import STORE_NAME, SessionStore

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


def use(name: str | None) -> None:
    """Make ``name`` this kernel's session (None: no session)."""
    _named.use_session(name)


def current() -> str | None:
    """This kernel's session name, or None."""
    return _named.session_name()


def _namespace() -> str:
    ns = _named.session_name()
    if not ns:
        raise RuntimeError(
            "this kernel has no session: connect with %cluster connect ADDRESS --session NAME"
        )
    return ns


def keep(name: str, value: Any) -> None:
    """Keep ``value`` (or the value of a ref) in this session under ``name`` (replacing)."""
    if not name.isidentifier():
        raise ValueError(f"a kept result needs a name that is a Python identifier, got {name!r}")
    _named.keep(_namespace(), name, value)


def kept() -> list[str]:
    """The names of the results this session keeps."""
    return _named.names(_namespace())


def forget(name: str) -> bool:
    """Stop keeping ``name`` (a ``put(name=)`` or kept result); True when it was kept."""
    return _named.forget(_named.session_namespace(what="kept results"), name)


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

    Returns ``{"actors": [...], "results": [...], "skipped": [...], "unbound": [...]}``:
    names already bound in the namespace are skipped (left as they are); results whose
    names are not Python identifiers are ``unbound`` (``nbcluster.get_named`` gets them).
    """
    ns = _namespace()
    out: dict[str, list[str]] = {"actors": [], "results": [], "skipped": [], "unbound": []}
    for name in named_actors():
        if not name.isidentifier() or name in user_ns:
            out["skipped"].append(name)
            continue
        user_ns[name] = _actor.get_actor(name, namespace=ns)
        out["actors"].append(name)
    for name in _named.names(ns):
        if not name.isidentifier():
            out["unbound"].append(name)
            continue
        if name in user_ns:
            out["skipped"].append(name)
            continue
        ref = _named.lookup(ns, name)
        if ref is None:  # forgotten meanwhile
            continue
        user_ns[name] = ref
        out["results"].append(name)
    return out
