"""The public surface of ``nbcluster.data`` and what importing it costs."""

from __future__ import annotations

import inspect
import subprocess
import sys

import nbcluster.data as data


def test_every_public_name_is_exported_and_documented() -> None:
    for name in data.__all__:
        obj = getattr(data, name)
        assert inspect.getdoc(obj), f"nbcluster.data.{name} has no docstring"
    for cls in (data.Dataset, data.DataIterator, data.GroupedData):
        for meth, fn in inspect.getmembers(cls, inspect.isfunction):
            if not meth.startswith("_"):
                assert inspect.getdoc(fn), f"{cls.__name__}.{meth} has no docstring"


def test_ray_names_are_there() -> None:
    ray_names = {
        "from_items",
        "range",
        "range_tensor",
        "from_pandas",
        "from_numpy",
        "from_arrow",
        "from_pandas_refs",
        "from_numpy_refs",
        "read_parquet",
        "read_csv",
        "read_json",
        "read_text",
        "read_numpy",
        "read_binary_files",
        "DataContext",
        "ActorPoolStrategy",
    }
    assert ray_names <= set(data.__all__)
    methods = {
        "map",
        "map_batches",
        "flat_map",
        "filter",
        "add_column",
        "drop_columns",
        "select_columns",
        "rename_columns",
        "limit",
        "repartition",
        "random_shuffle",
        "randomize_block_order",
        "sort",
        "groupby",
        "aggregate",
        "unique",
        "union",
        "zip",
        "split",
        "split_at_indices",
        "train_test_split",
        "streaming_split",
        "iter_rows",
        "iter_batches",
        "iter_torch_batches",
        "take",
        "take_batch",
        "take_all",
        "show",
        "count",
        "schema",
        "columns",
        "num_blocks",
        "size_bytes",
        "materialize",
        "stats",
        "to_pandas",
        "to_numpy_refs",
        "to_arrow_refs",
        "write_parquet",
        "write_csv",
        "write_json",
        "write_numpy",
        "preview",
    }
    assert methods <= set(dir(data.Dataset))


def _imports(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return set(out)


def test_import_nbcluster_does_not_import_pyarrow_and_data_is_light() -> None:
    assert "pyarrow" not in _imports("import nbcluster")
    mods = _imports("import nbcluster.data")
    assert "pyarrow" in mods
    for heavy in ("torch", "ipywidgets", "plotly", "tqdm", "IPython"):
        assert heavy not in mods, heavy
    assert "nbcluster.data" in _imports("import nbcluster; nbcluster.data")
