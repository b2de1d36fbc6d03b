"""Where a worker puts the values a call produces: returns and generator items alike.

A value is serialized once (refs it carries are marked escaped: another process may use
them), then sent inline in the reply when small, or written once into the node's shared
memory store, owned by the call's caller (the node frees it when that owner dies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.serialization import SerializedValue, serialize

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["place", "serialize_value", "split_returns"]


def serialize_value(client: CoreClient, value: Any, what: str) -> SerializedValue:
    """``value`` serialized; ``what`` names it in the error (e.g. "the return value of f")."""
    try:
        sv = serialize(value)
    except exc.SerializationError as e:
        raise exc.SerializationError(f"{what} could not be serialized: {e}") from None
    if sv.contained_refs:
        client.table.mark_escaped(
            [r.binary() for r in sv.contained_refs if r.owner_address == client.address]
        )
    return sv


def place(client: CoreClient, oid: bytes, sv: SerializedValue, owner: str) -> dict[str, Any]:
    """Inline when small, else written to the local store for ``owner``: the fields of the
    value's ``ObjectLocation``."""
    if sv.total_size <= client.config.max_inline_bytes:
        return {"object_id": oid, "data": sv.to_bytes(), "size": sv.total_size}
    client.write_to_store(oid, sv, owner)
    return {
        "object_id": oid,
        "in_store": True,
        "size": sv.total_size,
        "node_id": client.node_id,
        "node_address": client.node_address,
    }


def split_returns(spec: Any, result: Any) -> list[Any]:
    """A call's result as its ``spec.num_returns`` return values (a clear error otherwise)."""
    n = spec.num_returns
    if n == 1:
        return [result]
    if n == 0:
        return []
    values = list(result) if isinstance(result, (list, tuple)) else None
    if values is None or len(values) != n:
        got = len(values) if values is not None else f"a {type(result).__name__}"
        raise ValueError(
            f"{spec.function_name} declared num_returns={n} but returned {got}; "
            f"return a tuple or list of {n} values"
        )
    return values
