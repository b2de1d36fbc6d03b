"""Writing datasets: one file per non-empty block, written by the tasks that make the block.

The write is a map stage fused into the last operator of the plan, so blocks go from the
worker that computes them straight to the file, never through the driver. Files are named
``<write id>_<block id>.<ext>`` under the target directory, which is created if needed.
"""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from nbcluster.data._block import block_to_batch
from nbcluster.data._datasource import _filesystem_for
from nbcluster.data._logical import MapLike
from nbcluster.data._transform import Stage

__all__ = ["WriteStage", "write"]

_EXTENSIONS = {"parquet": "parquet", "csv": "csv", "json": "json", "numpy": "npy"}


@dataclasses.dataclass
class WriteStage(Stage):
    """Write each incoming block to a file; yield a one-row table saying what was written."""

    fmt: str
    fs: pafs.FileSystem
    directory: str
    write_id: str
    args: dict[str, Any]
    name: str = "Write"

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """Write, then report ``{"path", "num_rows"}``."""
        for table in blocks:
            if table.num_rows == 0:
                continue
            path = (
                f"{self.directory}/{self.write_id}_{uuid.uuid4().hex[:12]}.{_EXTENSIONS[self.fmt]}"
            )
            self._write(table, path)
            yield pa.table({"path": [path], "num_rows": [table.num_rows]})

    def _write(self, table: pa.Table, path: str) -> None:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path, filesystem=self.fs, **self.args)
        elif self.fmt == "csv":
            import pyarrow.csv as pcsv

            with self.fs.open_output_stream(path) as f:
                pcsv.write_csv(table, f, **self.args)
        elif self.fmt == "json":
            df = block_to_batch(table, "pandas")
            text = df.to_json(orient="records", lines=True, **self.args)
            with self.fs.open_output_stream(path) as f:
                f.write(text.encode("utf-8"))
        elif self.fmt == "numpy":
            column = self.args["column"]
            if column not in table.column_names:
                raise KeyError(
                    f"write_numpy: column {column!r} not found; the dataset has columns {table.column_names}"
                )
            arr = block_to_batch(table.select([column]), "numpy")[column]
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            with self.fs.open_output_stream(path) as f:
                f.write(buf.getvalue())
        else:  # pragma: no cover - formats are fixed by the callers
            raise ValueError(self.fmt)


def write(
    ds: Any, fmt: str, path: str, filesystem: pafs.FileSystem | None, args: dict[str, Any]
) -> None:
    """Run ``ds`` with a write stage at the end; return when every file is written."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"write_{fmt}: path must be a string, got {type(path).__name__}")
    fs, directory = _filesystem_for(os.fspath(path), filesystem)
    info = fs.get_file_info(directory)
    if info.type == pafs.FileType.File:
        raise FileExistsError(f"write_{fmt}: {path!r} is a file; give a directory to write into")
    fs.create_dir(directory, recursive=True)
    stage = WriteStage(
        fmt,
        fs,
        directory.rstrip("/"),
        uuid.uuid4().hex[:8],
        dict(args),
        name=f"Write{fmt.capitalize()}",
    )
    plan = MapLike((ds._plan,), stage=stage, preserves_rows=False)
    for _ in ds._execute(plan=plan).iter_bundles():
        pass
