"""Code versions: a changed actor class, the actors still running its old code, and restarts.

Every function and class sent to the cluster is exported under a hash of its pickled
source and closure, so a changed definition gets a new key and workers never run an older
copy of it (:func:`nbcluster.state.code_version` gives a function's, and an actor class's
by its source). Actors are different: an actor made
from the old class keeps running the old code. :class:`CodeVersions` looks, after every
cell, for actor classes of the notebook that were redefined; when live actors of the old
version are held by notebook variables, it prints **one** warning naming them, and
``%cluster restart-actors`` (:meth:`CodeVersions.restart`) kills them and makes them again
from the new class, with the same constructor arguments, name, namespace and lifetime,
putting the new handles where the old ones were.

``%autoreload`` reaches the workers the same way: while the ``autoreload`` extension is
loaded, modules imported from the notebook's own folder are pickled by value
(``cloudpickle.register_pickle_by_value``) and every remote function and class is pickled
again at its first use in each cell, so the code a task uses from those modules travels
with the task, under a hash that changes when the module is reloaded, instead of being
imported by each worker once and kept. (Classes of such modules are then rebuilt on the
other side too: ``isinstance`` against the notebook's copy is False for objects that come
back from a task.)
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from nbcluster import _actor, state
from nbcluster._actor import ActorClass, ActorHandle

__all__ = ["CodeVersions", "StaleActor", "find_handles"]


def find_handles(
    ns: MutableMapping[str, Any], max_items: int = 10_000
) -> Iterator[tuple[str, Any, Any, ActorHandle]]:
    """``(label, container, key, handle)`` of every actor handle in ``ns``: variables, and
    the items of lists and dicts one level deep (``pool[1]``, ``d['k']``)."""
    for name, value in list(ns.items()):
        if not isinstance(name, str) or name.startswith("_"):
            continue
        if isinstance(value, ActorHandle):
            yield name, ns, name, value
        elif isinstance(value, list):
            for i, item in enumerate(itertools.islice(value, max_items)):
                if isinstance(item, ActorHandle):
                    yield f"{name}[{i}]", value, i, item
        elif isinstance(value, dict):
            for k, item in itertools.islice(list(value.items()), max_items):
                if isinstance(item, ActorHandle):
                    yield f"{name}[{k!r}]", value, k, item


class StaleActor:
    """An actor of an older version of a class, and where the notebook holds it."""

    def __init__(self, label: str, container: Any, key: Any, handle: ActorHandle, new: Any):
        self.label = label
        self.container = container
        self.key = key
        self.handle = handle
        self.new_class = new


class CodeVersions:
    """Watches the notebook's actor classes and the actors made from them."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._classes: dict[str, ActorClass[Any]] = {}
        #: Actors of older class versions found by the last check (what restart remakes).
        self.stale: list[StaleActor] = []
        self._by_value: set[str] = set()

    # -- after each cell ----------------------------------------------------------------------
    def check(self) -> str | None:
        """Look for redefined actor classes with live actors of the old code; return the
        warning (also printed) or None."""
        ns = self.shell.user_ns
        changed: dict[str, ActorClass[Any]] = {}
        for name, value in list(ns.items()):
            if not isinstance(value, ActorClass) or name.startswith("_"):
                continue
            before = self._classes.get(name)
            self._classes[name] = value
            if before is not None and before is not value:
                changed[value._name] = value
        if not changed or not state.is_connected():
            return None
        versions = {cls_name: state.code_version(cls) for cls_name, cls in changed.items()}
        stale = []
        for label, container, key, handle in find_handles(ns):
            info = state.actor_handle_info(handle)
            new = changed.get(info["class_name"])
            old = info["code_version"]  # None: not made here, so not ours to restart
            if new is None or old is None or old == versions[info["class_name"]]:
                continue
            live = state.actor_info(handle)
            if live is not None and live["state"] == "DEAD":
                continue
            stale.append(StaleActor(label, container, key, handle, new))
        self.stale = stale
        if not stale:
            return None
        names = ", ".join(sorted(changed))
        held = ", ".join(s.label for s in stale)
        text = (
            f"nbcluster: {names} changed, but {len(stale)} actor(s) still run the old code: "
            f"{held}. Run %cluster restart-actors to restart them on the new code (same "
            "arguments; their state starts over)."
        )
        print(text, file=sys.stderr, flush=True)
        return text

    def restart(self) -> list[str]:
        """Kill every stale actor and make it again from the new class; return the labels."""
        done = []
        for s in self.stale:
            creation = state.actor_handle_info(s.handle)["creation"]
            if creation is None:
                print(
                    f"nbcluster: {s.label} was not made by this kernel; make it again yourself",
                    file=sys.stderr,
                )
                continue
            options = {
                k: creation[k] for k in ("name", "namespace", "lifetime") if creation[k] is not None
            }
            _actor.kill(s.handle)
            if options.get("name"):
                _wait_name_free(options["name"], options.get("namespace"))
            factory = s.new_class.options(**options) if options else s.new_class
            new = factory.remote(*creation["args"], **creation["kwargs"])
            s.container[s.key] = new
            done.append(s.label)
        self.stale = []
        return done

    # -- %autoreload ---------------------------------------------------------------------------
    def sync_reloadable_modules(self) -> list[str]:
        """While ``autoreload`` is loaded, pickle the notebook folder's modules by value,
        and have every remote function and class pickled again at its next use (a reload
        may have changed the code they refer to); return the modules newly by value."""
        loaded = getattr(getattr(self.shell, "extension_manager", None), "loaded", set())
        if not any("autoreload" in str(name) for name in loaded):
            return []
        import cloudpickle

        state.refresh_exported_code()

        root = Path(os.getcwd()).resolve()
        added = []
        for name, module in list(sys.modules.items()):
            if name in self._by_value or name == "__main__" or module is None:
                continue
            file = getattr(module, "__file__", None)
            if not file or "site-packages" in file or "dist-packages" in file:
                continue
            try:
                inside = Path(file).resolve().is_relative_to(root)
            except (OSError, ValueError):
                continue
            if inside and not name.startswith("nbcluster"):
                cloudpickle.register_pickle_by_value(module)
                self._by_value.add(name)
                added.append(name)
        return added


def _wait_name_free(name: str, namespace: str | None, timeout: float = 10.0) -> None:
    """After a kill, the name is released once the head saw the actor die."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _actor.get_actor(name, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.05)
