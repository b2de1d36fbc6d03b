"""What Train builds on: from_items, map_batches, iter_batches, iter_torch_batches,
streaming_split (iterators sent to actors), on one shared cluster."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import nbcluster
from nbcluster import data

pytestmark = pytest.mark.integration
# Workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _double(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x": batch["x"] * 2, "y": batch["y"]}


def test_two_line_shape_with_torch(shared_cluster: object) -> None:
    torch = pytest.importorskip("torch")
    ds = data.from_items([{"x": [x], "y": [2 * x]} for x in range(200)]).map_batches(_double)
    seen = []
    for batch in ds.iter_torch_batches(batch_size=32, dtypes=torch.float32):
        assert set(batch) == {"x", "y"}
        assert batch["x"].shape[1:] == (1,) and batch["x"].dtype == torch.float32
        assert torch.equal(batch["x"], batch["y"])  # 2x == 2x
        seen.append(batch["x"].shape[0])
    assert seen == [32] * 6 + [8]


def test_iter_batches_formats_and_drop_last(shared_cluster: object) -> None:
    ds = data.range(1000, override_num_blocks=7)
    sizes = [len(b["id"]) for b in ds.iter_batches(batch_size=300, drop_last=True)]
    assert sizes == [300, 300, 300]
    ids = np.concatenate([b["id"] for b in ds.iter_batches(batch_size=128)])
    assert sorted(ids.tolist()) == list(range(1000))
    df = next(iter(ds.iter_batches(batch_size=10, batch_format="pandas")))
    assert list(df.columns) == ["id"] and len(df) == 10
    table = next(iter(ds.iter_batches(batch_size=None, batch_format="pyarrow")))
    assert table.num_rows > 0
    shuffled = np.concatenate(
        [
            b["id"]
            for b in ds.iter_batches(
                batch_size=100, local_shuffle_buffer_size=300, local_shuffle_seed=0
            )
        ]
    )
    assert sorted(shuffled.tolist()) == list(range(1000))
    assert shuffled.tolist() != sorted(shuffled.tolist())


def test_torch_collate_fn(shared_cluster: object) -> None:
    torch = pytest.importorskip("torch")

    def collate(batch: dict[str, np.ndarray]) -> object:
        return torch.as_tensor(batch["id"] * 10)

    out = list(data.range(10).iter_torch_batches(batch_size=5, collate_fn=collate))
    assert [t.tolist() for t in out] == [[0, 10, 20, 30, 40], [50, 60, 70, 80, 90]]
    with pytest.raises(ValueError, match="either collate_fn or dtypes"):
        next(iter(data.range(10).iter_torch_batches(collate_fn=collate, dtypes=torch.float32)))


@nbcluster.remote
class _Worker:
    def consume(self, it: data.DataIterator, epochs: int) -> list[tuple[int, int]]:
        out = []
        for _ in range(epochs):
            n = total = 0
            for batch in it.iter_batches(batch_size=50):
                n += len(batch["id"])
                total += int(batch["id"].sum())
            out.append((n, total))
        return out


@pytest.mark.parametrize("equal", [True, False])
def test_streaming_split_feeds_actors(shared_cluster: object, equal: bool) -> None:
    ds = data.range(1001, override_num_blocks=9).map_batches(lambda b: {"id": b["id"]})
    its = ds.streaming_split(2, equal=equal)
    assert its[0].schema() is None  # a map's output schema is unknown until it runs
    assert data.range(5).streaming_split(1)[0].schema().names == ["id"]
    workers = [_Worker.remote() for _ in its]
    results = nbcluster.get([w.consume.remote(it, 2) for w, it in zip(workers, its, strict=True)])
    for epoch in range(2):
        rows = [r[epoch][0] for r in results]
        if equal:
            assert rows == [500, 500]  # one row dropped, as Ray does with equal=True
        else:
            assert sum(rows) == 1001
            assert sum(r[epoch][1] for r in results) == sum(range(1001))
    for w in workers:
        nbcluster.kill(w)


def test_iterator_rows_materialize_and_repr(shared_cluster: object) -> None:
    it = data.range(20).iterator()
    assert [r["id"] for r in it.iter_rows()] == list(range(20))
    mat = it.materialize()
    assert isinstance(mat, data.MaterializedDataset) and mat.count() == 20
    assert repr(it).startswith("DataIterator(")
    assert it.schema().names == ["id"]
