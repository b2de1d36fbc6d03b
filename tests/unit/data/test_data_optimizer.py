"""The planner's rules and fusion (``nbcluster.data._optimizer``), without processes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from nbcluster.data._datasource import ReadTask
from nbcluster.data._logical import (
    AllToAll,
    Limit,
    MapLike,
    Read,
    Union,
    known_count,
    known_schema,
    walk,
)
from nbcluster.data._optimizer import explain, optimize, to_physical
from nbcluster.data._transform import FilterStage, MapBatchesStage, MapRowsStage, ProjectStage
from nbcluster.data.compute import ActorPoolStrategy, TaskPoolStrategy

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])


class Planner:
    """A fake parquet planner: records what the optimizer pushed into it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, columns: Any, filter: Any) -> tuple[list[ReadTask], pa.Schema]:  # noqa: A002
        self.calls.append((columns, filter))
        schema = pa.schema([SCHEMA.field(c) for c in columns]) if columns else SCHEMA
        tasks = [ReadTask(lambda: iter(()), 100, 1000) for _ in range(4)]
        return tasks, schema


def read(planner: Planner | None = None) -> Read:
    planner = planner or Planner()
    tasks, schema = planner(None, None)
    planner.calls.clear()
    return Read((), tasks=tasks, schema=schema, label="ReadParquet", replan=planner)


def maprows(inp: Any, **kw: Any) -> MapLike:
    return MapLike(
        (inp,), stage=MapRowsStage(lambda r: r, name="Map(f)"), preserves_rows=True, **kw
    )


def batches(inp: Any, compute: Any = None, **kw: Any) -> MapLike:
    return MapLike(
        (inp,),
        stage=MapBatchesStage(lambda b: b, None, "default", name="MapBatches(g)"),
        compute=compute or TaskPoolStrategy(),
        **kw,
    )


def names(op: Any) -> list[str]:
    return [o.name for o in walk(op)]


def test_limit_moves_before_row_preserving_maps() -> None:
    plan = Limit((maprows(maprows(read())),), n=5)
    assert names(optimize(plan)) == ["ReadParquet", "Limit[5]", "Map(f)", "Map(f)"]


def test_limit_stays_after_maps_that_change_row_counts() -> None:
    plan = Limit((batches(read()),), n=5)
    assert names(optimize(plan))[-1] == "Limit[5]"


def test_limits_merge_and_trim_known_reads() -> None:
    plan = Limit((Limit((read(),), n=250),), n=150)
    opt = optimize(plan)
    assert isinstance(opt, Limit) and opt.n == 150
    src = opt.inputs[0]
    assert isinstance(src, Read) and len(src.tasks) == 2  # 2 x 100 rows cover 150
    assert known_count(opt) == 150


def test_projection_pushed_into_parquet_read() -> None:
    planner = Planner()
    plan = MapLike((read(planner),), stage=ProjectStage(select=("c", "a")), preserves_rows=True)
    opt = optimize(plan)
    assert isinstance(opt, Read) and opt.columns == ["c", "a"]
    assert planner.calls == [(["c", "a"], None)]
    assert known_schema(opt).names == ["c", "a"]


def test_drop_columns_pushed_as_the_remaining_columns() -> None:
    planner = Planner()
    plan = MapLike((read(planner),), stage=ProjectStage(drop=("b",)), preserves_rows=True)
    opt = optimize(plan)
    assert isinstance(opt, Read) and opt.columns == ["a", "c"]


def test_rename_is_not_pushed() -> None:
    plan = MapLike((read(),), stage=ProjectStage(rename={"a": "x"}), preserves_rows=True)
    assert names(optimize(plan)) == ["ReadParquet", "Project"]


def test_filter_expression_pushed_into_read_then_projection() -> None:
    planner = Planner()
    expr = pc.field("a") > 5
    filtered = MapLike((read(planner),), stage=FilterStage(expr=expr))
    plan = MapLike((filtered,), stage=ProjectStage(select=("b",)), preserves_rows=True)
    opt = optimize(plan)
    assert isinstance(opt, Read)
    assert opt.columns == ["b"] and opt.filter.equals(expr)
    assert planner.calls[-1][0] == ["b"] and planner.calls[-1][1].equals(expr)
    assert known_count(opt) is not None  # the fake planner knows rows; real filtered reads do not


def test_row_predicates_are_not_pushed() -> None:
    plan = MapLike((read(),), stage=FilterStage(fn=lambda r: True, name="Filter(f)"))
    assert names(optimize(plan)) == ["ReadParquet", "Filter(f)"]


def test_read_and_task_maps_fuse_into_one_operator() -> None:
    phys = to_physical(optimize(batches(maprows(read()))))
    assert [p.name for p in phys] == ["ReadParquet->Map(f)->MapBatches(g)"]
    assert phys[0].kind == "source" and len(phys[0].stages) == 2


def test_different_resources_do_not_fuse() -> None:
    plan = batches(read(), remote_args={"num_gpus": 1})
    phys = to_physical(optimize(plan))
    assert [p.name for p in phys] == ["ReadParquet", "MapBatches(g)"]
    assert phys[1].inputs == (0,)


def test_task_maps_fuse_into_a_following_actor_pool() -> None:
    pool = ActorPoolStrategy(min_size=1, max_size=2)
    first = batches(read(), remote_args={"num_cpus": 0.5})
    plan = batches(
        maprows(first, remote_args={"num_cpus": 0.5}), compute=pool, remote_args={"num_cpus": 0.5}
    )
    phys = to_physical(optimize(plan))
    assert [p.name for p in phys] == ["ReadParquet", "MapBatches(g)->Map(f)->MapBatches(g)"]
    assert phys[1].uses_actors and len(phys[1].stages) == 3


def test_reads_fuse_into_actor_pools_with_the_same_resources() -> None:
    plan = batches(read(), compute=ActorPoolStrategy(size=2))
    phys = to_physical(optimize(plan))
    assert [(p.name, p.kind) for p in phys] == [("ReadParquet->MapBatches(g)", "source")]
    assert phys[0].uses_actors and phys[0].read_tasks


def test_all_to_all_limit_and_union_become_their_own_operators() -> None:
    left = batches(read())
    right = maprows(read())
    plan = Limit((AllToAll((Union((left, right)),), kind="sort", label="Sort"),), n=3)
    phys = to_physical(optimize(plan))
    kinds = [(p.name, p.kind) for p in phys]
    assert kinds == [
        ("ReadParquet->MapBatches(g)", "source"),
        ("ReadParquet->Map(f)", "source"),
        ("Union", "union"),
        ("Sort", "barrier"),
        ("Limit[3]", "limit"),
    ]
    assert phys[2].inputs == (0, 1) and phys[4].inputs == (3,)


def test_known_counts_and_schemas_through_the_plan() -> None:
    r = read()
    assert known_count(r) == 400
    assert known_count(maprows(r)) == 400
    assert known_count(batches(r)) is None
    assert known_count(AllToAll((r,), kind="sort")) == 400
    assert known_count(Union((r, r))) == 800
    proj = MapLike((r,), stage=ProjectStage(rename={"a": "x"}), preserves_rows=True)
    assert known_schema(proj).names == ["x", "b", "c"]
    assert known_schema(batches(r)) is None


def test_explain_shows_the_three_plans() -> None:
    planner = Planner()
    plan = MapLike((read(planner),), stage=ProjectStage(select=("a",)), preserves_rows=True)
    text = explain(maprows(plan))
    assert "Logical Plan --------\nReadParquet -> Project -> Map(f)" in text
    assert "(Optimized) --------\nReadParquet[columns=a] -> Map(f)" in text
    assert "0: ReadParquet[columns=a]->Map(f) [source]" in text


def test_projection_then_limit_both_reach_the_read() -> None:
    planner = Planner()
    plan = Limit(
        (MapLike((read(planner),), stage=ProjectStage(select=("a",)), preserves_rows=True),), n=5
    )
    opt = optimize(plan)
    assert isinstance(opt, Limit) and isinstance(opt.inputs[0], Read)
    src = opt.inputs[0]
    assert src.columns == ["a"] and src.pushed_limit == 5 and len(src.tasks) == 1
    assert src.tasks[0].num_rows == 5


def test_groupby_partial_aggregation_runs_in_the_producing_tasks() -> None:
    from nbcluster.data.aggregate import Mean

    agg = AllToAll(
        (batches(read()),),
        kind="aggregate",
        params={"keys": ["a"], "aggs": [Mean("c")]},
        label="Aggregate",
    )
    phys = to_physical(optimize(agg))
    assert [p.name for p in phys] == ["ReadParquet->MapBatches(g)->PartialAggregate", "Aggregate"]
    assert phys[1].all_to_all is not None and phys[1].all_to_all.params["partials"] is True
    # After an actor pool (not fusible), the partial step is a task operator of its own.
    pooled = AllToAll(
        (batches(read(), compute=ActorPoolStrategy(size=1), remote_args={"num_gpus": 1}),),
        kind="aggregate",
        params={"keys": [], "aggs": [Mean("c")]},
        label="Aggregate",
    )
    assert [p.kind for p in to_physical(optimize(pooled))] == ["source", "map", "map", "barrier"]


def test_shuffle_partitioning_runs_in_the_producing_tasks() -> None:
    shuffled = AllToAll(
        (maprows(read()),), kind="random_shuffle", params={"seed": 3}, label="RandomShuffle"
    )
    phys = to_physical(optimize(shuffled))
    assert [p.name for p in phys] == ["ReadParquet->Map(f)->ShuffleMap", "RandomShuffle"]
    params = phys[1].all_to_all.params
    assert params["premapped"] is True and params["partitions"] == 2  # 4 small reads -> 2 reducers
    fixed = AllToAll((read(),), kind="repartition", params={"num_blocks": 7, "shuffle": True})
    assert to_physical(optimize(fixed))[1].all_to_all.params["partitions"] == 7


def test_shuffle_map_stage_partitions_and_repeats_with_a_seed() -> None:
    from nbcluster.data._transform import SHUFFLE_OFFSETS, ShuffleMapStage

    table = pa.table({"a": list(range(100))})
    out = list(ShuffleMapStage(4, seed=1).apply(iter([table.slice(0, 50), table.slice(50)])))
    assert len(out) == 1 and sorted(out[0].column("a").to_pylist()) == list(range(100))
    offsets = __import__("json").loads(out[0].schema.metadata[SHUFFLE_OFFSETS])
    assert offsets[0] == 0 and offsets[-1] == 100 and len(offsets) == 5
    again = list(ShuffleMapStage(4, seed=1).apply(iter([table])))[0]
    assert again.column("a").to_pylist() == out[0].column("a").to_pylist()
