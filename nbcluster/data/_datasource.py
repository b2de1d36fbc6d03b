"""File datasources: path expansion on any ``pyarrow.fs`` filesystem, and read tasks.

``read_parquet`` and friends resolve their paths on the driver (files, directories read
recursively, globs, lists of these, URIs such as ``s3://bucket/key`` or plain local
paths), then plan :class:`ReadTask` objects: picklable callables that a worker runs to
produce blocks, with the row and byte estimates the executor budgets with. Parquet read
tasks are planned per row group: row groups that a ``filter`` rules out by their
statistics are dropped on the driver, and only the requested ``columns`` are read.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from nbcluster.data._block import column_from_values

__all__ = [
    "ReadTask",
    "binary_read_tasks",
    "csv_read_tasks",
    "group_units",
    "json_read_tasks",
    "numpy_read_tasks",
    "parquet_read_tasks",
    "resolve_paths",
    "text_read_tasks",
]

_GLOB_CHARS = "*?["
#: A scanner batch size no row group reaches, so each row group decodes as one batch.
_WHOLE_ROW_GROUP = (1 << 31) - 1  # the largest the scanner takes (int32)


@dataclasses.dataclass
class ReadTask:
    """One unit of reading: ``read()`` yields blocks; estimates let the executor budget."""

    read_fn: Callable[[], Iterator[pa.Table]]
    num_rows: int | None
    size_bytes: int | None
    input_files: tuple[str, ...] = ()
    schema: pa.Schema | None = None

    def __call__(self) -> Iterator[pa.Table]:
        return self.read_fn()

    def with_limit(self, n: int) -> ReadTask:
        """A copy that stops after ``n`` rows (parquet stops decoding there, too)."""
        if isinstance(self.read_fn, _ParquetRead):
            fn: Callable[[], Iterator[pa.Table]] = dataclasses.replace(self.read_fn, limit=n)
        else:
            fn = _Limited(self.read_fn, n)
        rows = None if self.num_rows is None else min(self.num_rows, n)
        size = self.size_bytes
        if size is not None and self.num_rows:
            size = size * (rows or 0) // self.num_rows
        return dataclasses.replace(self, read_fn=fn, num_rows=rows, size_bytes=size)


@dataclasses.dataclass
class _Limited:
    """The first ``n`` rows of another reader's blocks."""

    read_fn: Callable[[], Iterator[pa.Table]]
    n: int

    def __call__(self) -> Iterator[pa.Table]:
        left = self.n
        for table in self.read_fn():
            if left <= 0:
                return
            yield table.slice(0, left)
            left -= min(left, table.num_rows)


def _note_path(err: BaseException, path: str, what: str) -> BaseException:
    if hasattr(err, "add_note"):
        err.add_note(f"({what} could not read {path!r})")
    return err


# --------------------------------------------------------------------------- paths


def _filesystem_for(path: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        return filesystem, path
    if path.startswith("local://"):  # Ray's spelling of "on every node's local disk"
        path = path[len("local://") :]
    elif "://" in path:
        try:
            return pafs.FileSystem.from_uri(path)
        except (pa.ArrowInvalid, ValueError) as err:
            raise ValueError(f"cannot open {path!r}: {err}") from None
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))


def resolve_paths(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    filesystem: pafs.FileSystem | None,
    what: str,
    file_extensions: Sequence[str] | None = None,
    ignore_missing_paths: bool = False,
) -> tuple[pafs.FileSystem, list[tuple[str, int]]]:
    """``(filesystem, [(file path, size)])`` for files, directories, globs or lists of them."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if not isinstance(paths, Sequence) or not paths:
        raise ValueError(
            f"{what}: paths must be a path or a non-empty list of paths, got {paths!r}"
        )
    fs: pafs.FileSystem | None = None
    files: list[tuple[str, int]] = []
    for raw in paths:
        if not isinstance(raw, str | os.PathLike):
            raise TypeError(f"{what}: each path must be a string, got {type(raw).__name__}")
        p_fs, path = _filesystem_for(os.fspath(raw), filesystem)
        fs = fs or p_fs
        if any(c in path for c in _GLOB_CHARS):
            found = _glob(p_fs, path)
            if not found and not ignore_missing_paths:
                raise FileNotFoundError(f"{what}: no file matches the pattern {os.fspath(raw)!r}")
            files.extend(found)
            continue
        info = p_fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            if ignore_missing_paths:
                continue
            raise FileNotFoundError(f"{what}: the path {os.fspath(raw)!r} does not exist")
        if info.type == pafs.FileType.Directory:
            selector = pafs.FileSelector(path, recursive=True)
            entries = sorted(
                (e for e in p_fs.get_file_info(selector) if e.type == pafs.FileType.File),
                key=lambda e: e.path,
            )
            files.extend(
                (e.path, e.size or 0)
                for e in entries
                if not os.path.basename(e.path).startswith((".", "_"))
            )
        else:
            files.append((info.path, info.size or 0))
    if file_extensions:
        exts = tuple("." + e.lstrip(".").lower() for e in file_extensions)
        files = [f for f in files if f[0].lower().endswith(exts)]
    assert fs is not None
    if not files and not ignore_missing_paths:
        raise FileNotFoundError(f"{what}: no files found under {[os.fspath(p) for p in paths]}")
    return fs, files


def _glob(fs: pafs.FileSystem, pattern: str) -> list[tuple[str, int]]:
    parts = pattern.split("/")
    base_parts = []
    for part in parts:
        if any(c in part for c in _GLOB_CHARS):
            break
        base_parts.append(part)
    base = "/".join(base_parts) or "/"
    info = fs.get_file_info(base)
    if info.type != pafs.FileType.Directory:
        return []
    entries = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted(
        (e.path, e.size or 0)
        for e in entries
        if e.type == pafs.FileType.File and fnmatch.fnmatchcase(e.path, pattern)
    )


# --------------------------------------------------------------------------- grouping


def group_units(sizes: Sequence[int], parts: int) -> list[list[int]]:
    """Split unit indices into ``parts`` contiguous groups of similar total size."""
    n = len(sizes)
    parts = max(1, min(parts, n))
    if parts == n:
        return [[i] for i in range(n)]
    total = sum(sizes) or n
    groups: list[list[int]] = [[]]
    acc = 0.0
    per = total / parts
    for i, s in enumerate(sizes):
        left_units = n - i
        left_groups = parts - len(groups)
        if groups[-1] and (acc >= per * len(groups) or left_units <= left_groups):
            groups.append([])
        groups[-1].append(i)
        acc += s or (total / n)
    return [g for g in groups if g]


def _num_tasks(
    units: int, total_bytes: int, override: int | None, min_blocks: int, min_block: int
) -> int:
    if override is not None:
        if not isinstance(override, int) or override < 1:
            raise ValueError(f"override_num_blocks must be a positive int, got {override!r}")
        return min(override, max(units, 1))
    wanted = min_blocks
    if total_bytes and total_bytes / wanted < min_block:
        wanted = max(1, math.ceil(total_bytes / min_block))
    return max(1, min(wanted, units))


# --------------------------------------------------------------------------- parquet


def parquet_read_tasks(
    paths: Any,
    *,
    filesystem: pafs.FileSystem | None,
    columns: Sequence[str] | None,
    filter: Any,
    override_num_blocks: int | None,
    min_blocks: int,
    min_block_size: int,
    file_extensions: Sequence[str] | None = None,
) -> tuple[list[ReadTask], pa.Schema]:
    """Read tasks over the row groups of the files (pruned by ``filter``'s statistics)."""
    import pyarrow.dataset as pds

    fs, files = resolve_paths(paths, filesystem, "read_parquet", file_extensions)
    try:
        dataset = pds.dataset([f for f, _ in files], filesystem=fs, format="parquet")
    except (pa.ArrowInvalid, OSError) as err:
        raise type(err)(f"read_parquet: cannot read the parquet files: {err}") from None
    schema = dataset.schema
    if columns is not None:
        columns = list(columns)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ValueError(
                f"read_parquet: column(s) {missing} not in the files; they have {schema.names}"
            )
        schema = pa.schema([schema.field(c) for c in columns])
    units: list[tuple[str, int, int, int]] = []  # path, row group id, rows, bytes
    for frag in dataset.get_fragments(filter=filter):
        for piece in frag.split_by_row_group(filter):
            rg = piece.row_groups[0]
            units.append((frag.path, rg.id, rg.num_rows, rg.total_byte_size))
        if not frag.row_groups:  # an empty file
            units.append((frag.path, -1, 0, 0))
    if columns is not None and units:
        full = sum(1 for _ in dataset.schema) or 1
        scale = len(columns) / full
        units = [(p, r, n, int(b * scale)) for p, r, n, b in units]
    total = sum(u[3] for u in units)
    parts = _num_tasks(len(units), total, override_num_blocks, min_blocks, min_block_size)
    tasks = []
    for group in group_units([u[3] for u in units], parts):
        chosen = [units[i] for i in group]
        by_file: dict[str, list[int]] = {}
        for path, rg_id, _, _ in chosen:
            by_file.setdefault(path, [])
            if rg_id >= 0:
                by_file[path].append(rg_id)
        rows = None if filter is not None else sum(u[2] for u in chosen)
        tasks.append(
            ReadTask(
                _ParquetRead(fs, list(by_file.items()), columns, filter, schema),
                num_rows=rows,
                size_bytes=sum(u[3] for u in chosen),
                input_files=tuple(by_file),
                schema=schema,
            )
        )
    if not tasks:
        tasks.append(ReadTask(_Empty(schema), 0, 0, (), schema))
    return tasks, schema


@dataclasses.dataclass
class _Empty:
    schema: pa.Schema

    def __call__(self) -> Iterator[pa.Table]:
        yield self.schema.empty_table()


@dataclasses.dataclass
class _ParquetRead:
    fs: pafs.FileSystem
    pieces: list[tuple[str, list[int]]]
    columns: list[str] | None
    filter: Any
    schema: pa.Schema
    limit: int | None = None

    def __call__(self) -> Iterator[pa.Table]:
        import pyarrow.dataset as pds

        left = self.limit
        for path, row_groups in self.pieces:
            if left is not None and left <= 0:
                return
            try:
                if not row_groups:
                    yield self.schema.empty_table()
                    continue
                frag = pds.ParquetFileFormat().make_fragment(path, self.fs, row_groups=row_groups)
                if left is None:
                    # One batch per row group: the scanner's default batches are slices of
                    # the decoded row group, which compact() would have to copy (pickled,
                    # each slice carries the whole buffers).
                    yield frag.to_table(
                        schema=None,
                        columns=self.columns,
                        filter=self.filter,
                        batch_size=_WHOLE_ROW_GROUP,
                    )
                    continue
                # A limit: decode in small batches and stop as soon as there are enough rows.
                for batch in frag.to_batches(
                    columns=self.columns, filter=self.filter, batch_size=min(max(left, 1), 65536)
                ):
                    if left <= 0:
                        break
                    table = pa.Table.from_batches([batch]).slice(0, left)
                    left -= table.num_rows
                    yield table
            except Exception as err:
                raise _note_path(err, path, "read_parquet") from None


# --------------------------------------------------------------------------- other files


def _file_tasks(
    what: str,
    paths: Any,
    filesystem: pafs.FileSystem | None,
    reader: Callable[[pafs.FileSystem, str], pa.Table],
    override_num_blocks: int | None,
    min_blocks: int,
    min_block_size: int,
    file_extensions: Sequence[str] | None,
    include_paths: bool,
    ignore_missing_paths: bool = False,
    size_factor: float = 1.0,
) -> list[ReadTask]:
    fs, files = resolve_paths(paths, filesystem, what, file_extensions, ignore_missing_paths)
    sizes = [s for _, s in files]
    parts = _num_tasks(len(files), sum(sizes), override_num_blocks, min_blocks, min_block_size)
    tasks = []
    for group in group_units(sizes, parts):
        chosen = [files[i][0] for i in group]
        tasks.append(
            ReadTask(
                _FilesRead(what, fs, chosen, reader, include_paths),
                num_rows=None,
                size_bytes=int(sum(files[i][1] for i in group) * size_factor),
                input_files=tuple(chosen),
            )
        )
    return tasks


@dataclasses.dataclass
class _FilesRead:
    what: str
    fs: pafs.FileSystem
    paths: list[str]
    reader: Callable[[pafs.FileSystem, str], pa.Table]
    include_paths: bool

    def __call__(self) -> Iterator[pa.Table]:
        for path in self.paths:
            try:
                table = self.reader(self.fs, path)
            except Exception as err:
                raise _note_path(err, path, self.what) from None
            if self.include_paths:
                table = table.append_column("path", pa.array([path] * table.num_rows, pa.string()))
            yield table


@dataclasses.dataclass
class _CsvReader:
    kwargs: dict[str, Any]

    def __call__(self, fs: pafs.FileSystem, path: str) -> pa.Table:
        import pyarrow.csv as pcsv

        with fs.open_input_stream(path) as f:
            return pcsv.read_csv(f, **self.kwargs)


@dataclasses.dataclass
class _JsonReader:
    kwargs: dict[str, Any]

    def __call__(self, fs: pafs.FileSystem, path: str) -> pa.Table:
        import pyarrow.json as pjson

        with fs.open_input_stream(path) as f:
            return pjson.read_json(f, **self.kwargs)


@dataclasses.dataclass
class _TextReader:
    encoding: str
    drop_empty_lines: bool

    def __call__(self, fs: pafs.FileSystem, path: str) -> pa.Table:
        with fs.open_input_stream(path) as f:
            text = f.read().decode(self.encoding)
        lines = text.splitlines()
        if self.drop_empty_lines:
            lines = [line for line in lines if line.strip()]
        return pa.table({"text": pa.array(lines, pa.string())})


def _numpy_reader(fs: pafs.FileSystem, path: str) -> pa.Table:
    with fs.open_input_stream(path) as f:
        arr = np.load(io.BytesIO(f.read()), allow_pickle=False)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    return pa.table({"data": column_from_values(arr, "data")})


def _binary_reader(fs: pafs.FileSystem, path: str) -> pa.Table:
    with fs.open_input_stream(path) as f:
        data = f.read()
    return pa.table({"bytes": pa.array([data], pa.binary())})


def csv_read_tasks(paths: Any, **kw: Any) -> list[ReadTask]:
    """Read tasks for CSV files (``arrow_csv_args`` go to ``pyarrow.csv.read_csv``)."""
    args = kw.pop("arrow_csv_args")
    return _file_tasks("read_csv", paths, reader=_CsvReader(args), **kw)


def json_read_tasks(paths: Any, **kw: Any) -> list[ReadTask]:
    """Read tasks for JSON-lines files."""
    args = kw.pop("arrow_json_args")
    return _file_tasks("read_json", paths, reader=_JsonReader(args), **kw)


def text_read_tasks(
    paths: Any, *, encoding: str, drop_empty_lines: bool, **kw: Any
) -> list[ReadTask]:
    """Read tasks for text files: one row per line, column ``text``."""
    return _file_tasks("read_text", paths, reader=_TextReader(encoding, drop_empty_lines), **kw)


def numpy_read_tasks(paths: Any, **kw: Any) -> list[ReadTask]:
    """Read tasks for ``.npy`` files: column ``data``, one row per first-axis entry."""
    return _file_tasks("read_numpy", paths, reader=_numpy_reader, **kw)


def binary_read_tasks(paths: Any, **kw: Any) -> list[ReadTask]:
    """Read tasks for whole files: column ``bytes`` (and ``path`` with include_paths)."""
    return _file_tasks("read_binary_files", paths, reader=_binary_reader, **kw)
