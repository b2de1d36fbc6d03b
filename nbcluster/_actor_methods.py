"""Per-method options of actor classes: ``@nbcluster.method`` and the handle's method table.

``@nbcluster.method`` (Ray's ``@ray.method``) works bare or with options, and stores them as
attributes of the function; :func:`method_meta` reads them back for each method of a class
when the class is decorated, and :func:`check_concurrency_groups` refuses a method placed in
a concurrency group the class does not define, at once, naming the method and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

__all__ = ["check_call_group", "check_concurrency_groups", "method", "method_meta"]

F = TypeVar("F", bound=Callable[..., Any])

#: What ``@nbcluster.method(...)`` takes (Ray's names).
METHOD_OPTIONS = ("num_returns", "concurrency_group", "enable_task_events", "max_task_retries")

_NUM_RETURNS = "__nbcluster_num_returns__"
_GROUP = "__nbcluster_concurrency_group__"
_EVENTS = "__nbcluster_enable_task_events__"
_RETRIES = "__nbcluster_max_task_retries__"


def _check_num_returns(value: object) -> None:
    if value in ("streaming", "dynamic"):
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f'num_returns must be an integer >= 0, "streaming" or "dynamic", got {value!r}'
        )


def _default_returns(fn: Any) -> int | str:
    """Generator methods stream by default (Ray >= 2.8)."""
    gen = inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)
    return "streaming" if gen else 1


def check_group_name(value: object, where: str) -> None:
    """A concurrency group name: a non-empty string (or None for the default group)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(
            f"{where}: concurrency_group must be the name of one of the actor's "
            f"concurrency_groups (a non-empty string), got {value!r}"
        )


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


@overload
def method(__fn: F) -> F: ...


@overload
def method(
    *,
    num_returns: int | str = ...,
    concurrency_group: str | None = ...,
    enable_task_events: bool = ...,
    max_task_retries: int = ...,
) -> Callable[[F], F]: ...


def method(*args: Any, **options: Any) -> Any:
    """Set options of one actor method, as Ray's ``@ray.method``.

    Use it bare (``@nbcluster.method``) or with options::

        @nbcluster.remote(concurrency_groups={"io": 2})
        class Service:
            @nbcluster.method(concurrency_group="io")
            def fetch(self, url): ...

            @nbcluster.method(num_returns=2)
            def pair(self):
                return 1, 2

    ``num_returns``: refs each call returns. ``concurrency_group``: the group (one of the
    class's ``concurrency_groups``) the method's calls run in. ``enable_task_events``:
    False keeps the method's calls out of the state API and timeline.
    ``max_task_retries``: retries of a call interrupted by an actor restart (default: the
    actor's ``max_task_retries``).
    """
    if args:
        if len(args) == 1 and callable(args[0]) and not options:
            return args[0]  # bare @nbcluster.method: nothing to set
        raise TypeError(
            "@nbcluster.method takes no positional arguments: use it bare (@nbcluster.method) "
            f"or with options among {', '.join(METHOD_OPTIONS)}, e.g. "
            "@nbcluster.method(num_returns=2)"
        )
    for key in options:
        if key not in METHOD_OPTIONS:
            raise ValueError(
                f"Unexpected option {key!r} for @nbcluster.method; valid options: "
                f"{', '.join(METHOD_OPTIONS)}"
            )
    if "num_returns" in options:
        _check_num_returns(options["num_returns"])
    if "concurrency_group" in options:
        check_group_name(options["concurrency_group"], "@nbcluster.method")
    if "enable_task_events" in options:
        _check_bool("enable_task_events", options["enable_task_events"])
    if "max_task_retries" in options:
        retries = options["max_task_retries"]
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < -1:
            raise ValueError(
                f"max_task_retries must be an integer >= -1 (-1 means retry forever), "
                f"got {retries!r}"
            )

    def deco(fn: F) -> F:
        if "num_returns" in options:
            setattr(fn, _NUM_RETURNS, options["num_returns"])
        if options.get("concurrency_group") is not None:
            setattr(fn, _GROUP, options["concurrency_group"])
        if "enable_task_events" in options:
            setattr(fn, _EVENTS, options["enable_task_events"])
        if "max_task_retries" in options:
            setattr(fn, _RETRIES, options["max_task_retries"])
        return fn

    return deco


def method_meta(cls: type) -> dict[str, dict[str, Any]]:
    """``{method name: its options}`` for every method a handle can call."""
    meta: dict[str, dict[str, Any]] = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("__") and name not in ("__call__",):
            continue
        if not callable(member):
            continue
        fn = getattr(member, "__func__", member)
        entry: dict[str, Any] = {
            "num_returns": getattr(fn, _NUM_RETURNS, _default_returns(fn)),
            "is_async": inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn),
        }
        group = getattr(fn, _GROUP, None)
        if group is not None:
            entry["concurrency_group"] = group
        if getattr(fn, _EVENTS, True) is False:
            entry["enable_task_events"] = False
        if hasattr(fn, _RETRIES):
            entry["max_task_retries"] = getattr(fn, _RETRIES)
        meta[name] = entry
    return meta


def _defined(groups: Mapping[str, int] | None) -> str:
    return ", ".join(repr(g) for g in sorted(groups or {})) or "none"


def check_concurrency_groups(
    class_name: str, meta: Mapping[str, Mapping[str, Any]], groups: Mapping[str, int] | None
) -> None:
    """Every method's ``concurrency_group`` is one of the class's ``concurrency_groups``."""
    for name, entry in meta.items():
        group = entry.get("concurrency_group")
        if group is not None and group not in (groups or {}):
            raise ValueError(
                f"Method {class_name}.{name} is in concurrency group {group!r}, which the actor "
                f"does not define (defined: {_defined(groups)}). Define it with "
                f"@nbcluster.remote(concurrency_groups={{{group!r}: <max calls at once>}})."
            )


def check_call_group(
    class_name: str, method_name: str, group: object, meta: Mapping[str, Any]
) -> None:
    """A per-call ``.options(concurrency_group=...)`` names a group the actor defines."""
    check_group_name(group, f"{class_name}.{method_name}.options()")
    groups = meta.get("concurrency_groups") or {}
    if group is not None and group not in groups:
        raise ValueError(
            f"{class_name}.{method_name}.options(concurrency_group={group!r}): the actor has no "
            f"concurrency group {group!r} (defined: {_defined(groups)}). Pass one of those, or "
            "define the group in @nbcluster.remote(concurrency_groups=...)."
        )
