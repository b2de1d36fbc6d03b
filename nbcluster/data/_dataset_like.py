"""``DatasetLike``: a dataset as the modules below ``dataset.py`` see it (a leaf module).

``dataset.py`` imports ``iterator.py`` (``Dataset.iterator()``, ``streaming_split``) and
``grouped_data.py`` (``Dataset.groupby``), yet a ``DataIterator`` materializes into a
dataset and ``GroupedData`` builds one. They name this protocol, which ``Dataset``
implements, instead of importing the class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa

from nbcluster.data._logical import LogicalOp
from nbcluster.data._schema import Schema
from nbcluster.data.context import DataContext

__all__ = ["DatasetLike"]


class DatasetLike(Protocol):
    """A ``Dataset`` (``nbcluster.data.dataset``): its plan, and how to read it."""

    @property
    def _plan(self) -> LogicalOp:
        """The logical plan that produces the rows."""

    @property
    def context(self) -> DataContext:
        """The settings the dataset runs with."""

    def _known_schema(self) -> pa.Schema | None:
        """The schema, when it is known without running anything."""

    def _with(self, op: LogicalOp) -> DatasetLike:
        """A dataset with ``op`` as its plan (same context)."""

    def schema(self, fetch_if_missing: bool = True) -> Schema | None:
        """The schema of the rows."""

    def count(self) -> int:
        """How many rows."""

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Every row as a dict."""

    def take(self, limit: int = 20) -> list[dict[str, Any]]:
        """Up to ``limit`` rows."""

    def take_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every row."""

    def show(self, limit: int = 20) -> None:
        """Print up to ``limit`` rows."""

    def materialize(self) -> Any:
        """Run the plan and keep every block in the object store."""
