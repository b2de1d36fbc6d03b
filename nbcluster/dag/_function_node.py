"""``FunctionNode``: a remote function call in a lazy graph (``f.bind(...)``)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from nbcluster.dag._dag_node import DAGNode, check_bindable

__all__ = ["FunctionNode", "changed_options"]


def changed_options(options: Any) -> dict[str, Any]:
    """The fields of an options dataclass that differ from their defaults."""
    if options is None or not dataclasses.is_dataclass(options):
        return {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(options, f.name)
        if value != default:
            out[f.name] = dict(value) if f.name == "resources" else value
    return out


def check_signature(
    signature_of: Any, args: tuple[Any, ...], kwargs: dict[str, Any], where: str, *, method: bool
) -> None:
    """Raise ``TypeError`` now if the call could never bind (nodes count as arguments)."""
    try:
        sig = inspect.signature(signature_of)
    except (TypeError, ValueError):
        return
    try:
        if method:
            sig.bind(None, *args, **kwargs)
        else:
            sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{where}: {e}") from None


class FunctionNode(DAGNode):
    """A call of a remote function, made by ``f.bind(...)`` or ``f.options(...).bind(...)``.

    When the DAG is executed it runs as ``f.remote(...)`` (with the same options), the
    results of upstream nodes given as refs, and gives an ``ObjectRef`` (a list of them
    when ``num_returns > 1``, ``None`` when it is 0).
    """

    def __init__(
        self,
        remote_function: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        options: Any = None,
        submit: Any = None,
    ) -> None:
        """Made by ``RemoteFunction.bind``; ``submit`` is what ``.remote()`` is called on
        (the function, or its ``.options(...)`` wrapper) and ``options`` its options."""
        function = remote_function.function
        self._name = getattr(function, "__qualname__", getattr(function, "__name__", "function"))
        check_bindable(args, kwargs, f"{self._name}.bind()")
        check_signature(function, args, kwargs, f"{self._name}.bind()", method=False)
        super().__init__(args, kwargs)
        self._remote_function = remote_function
        self._submit = submit if submit is not None else remote_function
        self._options = options

    def _body(self) -> str:
        return self._name

    def _display_options(self) -> dict[str, Any]:
        return changed_options(self._options)

    def _run(self, ctx: Any) -> Any:
        args, kwargs = ctx.arguments(self)
        return self._submit.remote(*args, **kwargs)
