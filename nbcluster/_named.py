"""Named results: ``nbcluster.put(value, name=...)`` keeps a value for the session.

A session is a namespace on a cluster that outlives the process that uses it: a notebook
names it with ``%cluster connect ADDRESS --session NAME`` (:func:`use_session`), a script
with ``nbcluster.init(address=..., namespace=NAME)``. Its results live in a store actor
of that namespace (:class:`SessionStore`, named :data:`STORE_NAME`, detached), which puts
each value into the object store itself: the object is owned by the store, so it
survives the kernel or script that made it.

- ``put(value, name="model")`` sends ``value`` to the store and returns a ref to the
  kept object. A name is kept once: putting it again is a ``ValueError`` (drop it first
  with ``nbcluster.jupyter.session.forget(name)``, or ``%cluster keep`` to replace).
- ``get_named("model")`` returns a ref to it from any process of the session, also
  after a restart; in a notebook, ``%cluster connect`` with the same session binds each
  named result whose name is a Python identifier to a ref again (as ``%cluster keep``
  results are), and says which.

Ray has no ``put(name=)``; this follows Ray's named actors (``get_actor(name,
namespace=)``, ``ValueError`` when there is none).
"""

from __future__ import annotations

import threading
from typing import Any

from nbcluster import _api
from nbcluster._actor import get_actor
from nbcluster._refs import ObjectRef
from nbcluster._remote import remote

__all__ = [
    "STORE_NAME",
    "SessionStore",
    "forget",
    "get_named",
    "keep",
    "lookup",
    "names",
    "put",
    "session_name",
    "session_namespace",
    "store",
    "use_session",
]

#: The name of the store actor in the session's namespace.
STORE_NAME = "__nbcluster_session__"


@remote(num_cpus=0, max_restarts=0)
class SessionStore:
    """Holds the results a session kept: each is put into the object store by this actor,
    which owns it, so it lives as long as the store (a detached actor)."""

    def __init__(self) -> None:
        self.refs: dict[str, Any] = {}

    def keep(self, name: str, value: Any) -> int:
        """Keep ``value`` under ``name`` (replacing what had the name); return how many
        results are kept."""
        self.refs[name] = [_api.put(value)]  # in a list: handed out as a ref, not a value
        return len(self.refs)

    def add(self, name: str, value: Any) -> list[Any] | None:
        """Keep ``value`` under ``name`` unless the name is taken: ``[ref]``, or None."""
        if name in self.refs:
            return None
        self.refs[name] = [_api.put(value)]
        return self.refs[name]

    def get(self, name: str) -> list[Any]:
        """``[ref]`` to the value kept as ``name`` (KeyError when there is none)."""
        return self.refs[name]

    def lookup(self, name: str) -> list[Any] | None:
        """``[ref]`` to the value kept as ``name``, or None."""
        return self.refs.get(name)

    def names(self) -> list[str]:
        """What is kept, oldest first."""
        return list(self.refs)

    def forget(self, name: str) -> bool:
        """Drop ``name``; True when it was kept."""
        return self.refs.pop(name, None) is not None


_lock = threading.Lock()
_session: dict[str, str] = {}


def use_session(name: str | None) -> None:
    """Make ``name`` this process's session (None: no session)."""
    if name is None:
        _session.pop("name", None)
    elif not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"a session name is letters, digits, '-', '_' and '.', got {name!r}")
    else:
        _session["name"] = name


def session_name() -> str | None:
    """This process's session (``%cluster connect --session``), or None."""
    return _session.get("name")


def session_namespace(namespace: str | None = None, what: str = "named results") -> str:
    """The namespace whose store holds the named results: ``namespace`` if given, else the
    session's, else the job's (``init(namespace=...)``); an error naming the fix if none."""
    if namespace is not None:
        return namespace
    name = _session.get("name")
    if name:
        return name
    if _api.is_initialized():
        ns = str(_api.get_runtime_context().namespace or "")
        if ns:
            return ns
    raise ValueError(
        f"{what} are kept for a session, and this process has none: in a notebook, connect "
        "with %cluster connect ADDRESS --session NAME; in a script, "
        "nbcluster.init(address=..., namespace=NAME)"
    )


def store(namespace: str, create: bool) -> Any:
    """The store actor of ``namespace`` (made when ``create``; else None when there is none)."""
    with _lock:
        try:
            return get_actor(STORE_NAME, namespace=namespace)
        except ValueError:
            if not create:
                return None
            return SessionStore.options(
                name=STORE_NAME, namespace=namespace, lifetime="detached", get_if_exists=True
            ).remote()


def keep(namespace: str, name: str, value: Any) -> None:
    """Keep ``value`` (or the value of a ref) in ``namespace``'s store under ``name``,
    replacing what had the name."""
    _api.get(store(namespace, create=True).keep.remote(name, value))


def names(namespace: str) -> list[str]:
    """The names of the results kept in ``namespace``, oldest first."""
    s = store(namespace, create=False)
    return [] if s is None else list(_api.get(s.names.remote()))


def lookup(namespace: str, name: str) -> ObjectRef | None:
    """A ref to the result kept in ``namespace`` as ``name``, or None."""
    s = store(namespace, create=False)
    got = None if s is None else _api.get(s.lookup.remote(name))
    return None if got is None else got[0]


def forget(namespace: str, name: str) -> bool:
    """Stop keeping ``name`` in ``namespace``; True when it was kept."""
    s = store(namespace, create=False)
    return bool(s is not None and _api.get(s.forget.remote(name)))


def put(value: Any, *, name: str | None = None) -> ObjectRef:
    """Store ``value`` in the cluster and return a ref to it (``ray.put``).

    Small values stay in this process; large ones (over 100 KiB) go to the local node's
    shared-memory store, from which ``get`` maps numpy arrays without copying.

    ``name``: keep the value for this session under that name (nbcluster's addition): it
    is owned by the session's store, so it outlives this process, and
    :func:`get_named` (or, in a notebook, ``%cluster connect`` with the same
    ``--session``, which binds it to the name again) gets it back. A name is kept once;
    putting it again raises ``ValueError``.
    """
    if name is None:
        return _api.put(value)
    if not isinstance(name, str):
        raise TypeError(f"put(name=...) takes a str, got {type(name).__name__}: {name!r}")
    if not name or name != name.strip():
        raise ValueError(
            f"put(name=...) needs a non-empty name without surrounding spaces, got {name!r}"
        )
    if isinstance(value, ObjectRef):
        raise TypeError(
            "nbcluster.put() was given an ObjectRef; to keep the value of a ref for the "
            "session, use %cluster keep VAR (or pass the value itself)"
        )
    ns = session_namespace(what="put(name=...) results")
    got = _api.get(store(ns, create=True).add.remote(name, value))
    if got is None:
        raise ValueError(
            f"a result named {name!r} is already kept in session {ns!r}; choose another "
            f"name, or drop the old one first with nbcluster.jupyter.session.forget({name!r})"
        )
    ref = got[0]
    assert isinstance(ref, ObjectRef)
    return ref


def get_named(name: str, *, namespace: str | None = None) -> ObjectRef:
    """A ref to the result kept as ``name`` (``put(value, name=...)`` or ``%cluster
    keep``) in ``namespace`` (default: this process's session).

    Raises ``ValueError`` when there is none, saying what the session keeps.
    """
    if not isinstance(name, str):
        raise TypeError(f"get_named() takes a str name, got {type(name).__name__}: {name!r}")
    ns = session_namespace(namespace, what="get_named() results")
    ref = lookup(ns, name)
    if ref is None:
        have = names(ns)
        kept = ", ".join(repr(n) for n in have) if have else "nothing"
        raise ValueError(f"no result named {name!r} in session {ns!r} (it keeps {kept})")
    return ref
