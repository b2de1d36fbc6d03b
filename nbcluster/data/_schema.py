"""``Schema``: the column names and types of a dataset (Ray's ``ray.data.Schema``)."""

from __future__ import annotations

import html
from typing import Any

import pyarrow as pa

__all__ = ["Schema"]


class Schema:
    """Names and types of a dataset's columns; ``base_schema`` is the Arrow schema."""

    def __init__(self, base_schema: pa.Schema) -> None:
        self.base_schema = base_schema

    @property
    def names(self) -> list[str]:
        """Column names, in order."""
        return list(self.base_schema.names)

    @property
    def types(self) -> list[pa.DataType]:
        """Arrow types, in the order of :attr:`names`."""
        return list(self.base_schema.types)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Schema):
            return self.base_schema == other.base_schema
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.names))

    def __len__(self) -> int:
        return len(self.base_schema)

    def __repr__(self) -> str:
        names = ["Column"] + self.names
        types = ["Type"] + [str(t) for t in self.types]
        width = max(len(n) for n in names)
        lines = [f"{names[0]:<{width}}  {types[0]}", f"{'-' * 6:<{width}}  ----"]
        lines += [f"{n:<{width}}  {t}" for n, t in zip(names[1:], types[1:], strict=True)]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(n)}</td><td><code>{html.escape(str(t))}</code></td></tr>"
            for n, t in zip(self.names, self.types, strict=True)
        )
        return f"<table><tr><th>Column</th><th>Type</th></tr>{rows}</table>"

    def _mapping(self) -> dict[str, Any]:
        return {n: t for n, t in zip(self.names, self.types, strict=True)}
