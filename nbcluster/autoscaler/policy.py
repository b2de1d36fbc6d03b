"""The autoscaler's decisions: a pure function of (cluster state, demand, config, time).

:func:`decide` reads no clock and does no I/O, like ``_runtime/scheduling/policy.py``;
``tests/autoscaler/test_policy.py`` drives it with synthetic states. What it does, in order:

1. **Feasibility.** A demanded shape that no worker node type (and no existing node) could
   ever hold is *infeasible*: reported (with the shape and the node types) and never
   launched for.
2. **Bin-packing onto what exists.** Queued lease requests, infeasible-for-now requests and
   pending placement groups are packed, largest shapes first, onto the free resources of
   running nodes and onto the full resources of nodes still launching (so demand already
   being served is not launched for twice).
3. **New nodes.** What is left is packed onto new nodes. For each shape the node type is
   chosen like Ray's utilization scorer: prefer types that do not waste GPUs, then the
   type that the remaining demand would fill best. Launches respect each type's
   ``max_workers``, the cluster's ``max_workers``, a type's back-off after failed launches,
   and ``upscaling_speed`` (pending launches at most ``max(5, speed * running workers)``).
4. **request_resources().** Its bundles are packed onto the nodes' *total* resources (so
   running work counts as using them), and more nodes are launched for what does not fit,
   bypassing ``upscaling_speed`` (as Ray does). Nodes holding those bundles are kept.
5. **min_workers.** Types below their minimum get launches.
6. **Termination.** A worker node is removed when it has been idle for ``idle_timeout``,
   nothing packed onto it this tick, it is not kept for ``request_resources``, its type
   stays at or above ``min_workers``, and it is not busy: a node with running tasks,
   actors, placement-group bundles or objects whose primary copy lives there is never
   removed. Nodes that did not join within ``launch_timeout_s`` are removed too.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from nbcluster.autoscaler.config import ClusterConfig, NodeTypeConfig

__all__ = [
    "Backoff",
    "ClusterState",
    "Decision",
    "Demand",
    "Infeasible",
    "NodeStatus",
    "PlacementGroupDemand",
    "ShapeKey",
    "Waiting",
    "decide",
    "format_shape",
    "shape_key",
]

EPS = 1e-9
#: Ray's floor on pending launches, whatever ``upscaling_speed`` says.
MIN_PENDING_LAUNCHES = 5

Shape = Mapping[str, float]
ShapeKey = tuple[tuple[str, float], ...]


def shape_key(shape: Shape) -> ShapeKey:
    """A hashable, canonical form of a resource shape (zero amounts dropped)."""
    return tuple(sorted((k, float(v)) for k, v in shape.items() if v > 0))


def format_shape(shape: Shape | ShapeKey) -> str:
    """``{CPU: 1, GPU: 0.5}``."""
    items = shape if isinstance(shape, tuple) else shape_key(shape)
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in items) + "}"


# -- inputs --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as the autoscaler sees it.

    ``node_type`` is None for nodes the autoscaler did not launch (the head's node, nodes
    joined by hand): their resources count, but they are never removed. ``busy`` says why
    the node must not be removed now ("" when it is idle); ``idle_since`` is when it last
    became idle (None while busy).
    """

    node_id: str
    node_type: str | None
    state: Literal["running", "launching", "draining"]
    total: Shape
    available: Shape
    busy: str = ""
    idle_since: float | None = None
    launched_at: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    """A node type whose launches failed: no new launch before ``retry_at``."""

    failures: int
    retry_at: float
    last_error: str = ""


@dataclasses.dataclass(frozen=True)
class ClusterState:
    """Nodes, launches asked of the provider but not listed by it yet, and back-offs."""

    nodes: Sequence[NodeStatus] = ()
    pending_launches: Mapping[str, int] = dataclasses.field(default_factory=dict)
    backoff: Mapping[str, Backoff] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PlacementGroupDemand:
    """A placement group waiting for room: its bundles and strategy."""

    bundles: Sequence[Shape]
    strategy: str = "PACK"
    name: str = ""


@dataclasses.dataclass(frozen=True)
class Demand:
    """What the cluster is asked for.

    ``pending``: lease requests queued on nodes, as (shape, count). ``infeasible``: lease
    requests no current node can ever fit (a new node type might). ``placement_groups``:
    groups not placed yet. ``requested``: the bundles of the last ``request_resources()``,
    as (shape, count).
    """

    pending: Sequence[tuple[Shape, int]] = ()
    infeasible: Sequence[tuple[Shape, int]] = ()
    placement_groups: Sequence[PlacementGroupDemand] = ()
    requested: Sequence[tuple[Shape, int]] = ()


# -- outputs -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Infeasible:
    """A shape no node type can ever hold."""

    shape: ShapeKey
    count: int
    message: str


@dataclasses.dataclass(frozen=True)
class Waiting:
    """Feasible demand left unplaced this tick, and why (a cap, a back-off)."""

    shape: ShapeKey
    count: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do now: launches per node type, nodes to remove (id, reason), and reports."""

    launch: dict[str, int]
    terminate: list[tuple[str, str]]
    infeasible: list[Infeasible]
    waiting: list[Waiting]
    reasons: dict[str, str]


# -- packing -------------------------------------------------------------------------------------
class _Bin:
    __slots__ = ("room", "node", "node_type", "used", "kept", "sources", "new")

    def __init__(
        self, room: dict[str, float], node: NodeStatus | None, node_type: str | None, new: bool
    ) -> None:
        self.room = room
        self.node = node
        self.node_type = node_type
        self.new = new
        self.used = False
        self.kept = False
        self.sources: Counter[tuple[str, ShapeKey]] = Counter()


def _times(shape: ShapeKey, room: Mapping[str, float]) -> int:
    """How many copies of ``shape`` fit in ``room``."""
    n = -1
    get = room.get
    for k, v in shape:
        have = get(k, 0.0) + EPS
        if have < v:
            return 0
        q = int(have / v)
        if n < 0 or q < n:
            n = q
    return max(n, 0)


def _take(room: dict[str, float], shape: ShapeKey, times: int) -> None:
    for k, v in shape:
        room[k] = room.get(k, 0.0) - v * times


def _fits(shape: ShapeKey, resources: Mapping[str, float]) -> bool:
    return all(resources.get(k, 0.0) + EPS >= v for k, v in shape)


def _size(shape: ShapeKey) -> tuple[float, int, float]:
    d = dict(shape)
    return (d.get("GPU", 0.0), len(shape), sum(v for _, v in shape))


def _pack(
    items: Sequence[tuple[ShapeKey, int, str]], bins: Sequence[_Bin], mark_used: bool = True
) -> list[tuple[ShapeKey, int, str]]:
    """First-fit decreasing with counts; returns what did not fit."""
    left: list[tuple[ShapeKey, int, str]] = []
    for shape, count, source in items:
        for b in bins:
            if count <= 0:
                break
            k = min(count, _times(shape, b.room))
            if k <= 0:
                continue
            _take(b.room, shape, k)
            count -= k
            b.sources[(source, shape)] += k
            if mark_used:
                b.used = True
            else:
                b.kept = True
        if count > 0:
            left.append((shape, count, source))
    return left


def _pack_distinct(bundles: Sequence[ShapeKey], bins: Sequence[_Bin]) -> list[ShapeKey]:
    """STRICT_SPREAD: each bundle on a different bin; returns the bundles left over.

    ``bins`` should be only bins that might have room (see :func:`_with_room`)."""
    taken: set[int] = set()
    left: list[ShapeKey] = []
    for shape in sorted(bundles, key=_size, reverse=True):
        for i, b in enumerate(bins):
            if i not in taken and _times(shape, b.room) >= 1:
                _take(b.room, shape, 1)
                b.used = True
                b.sources[("placement group", shape)] += 1
                taken.add(i)
                break
        else:
            left.append(shape)
    return left


def _with_room(groups: Sequence[Sequence[ShapeKey]], bins: Sequence[_Bin]) -> list[_Bin]:
    """The bins that can hold at least the smallest bundle of any group (one pass)."""
    smallest = {min(g, key=lambda b: sum(v for _, v in b)) for g in groups if g}
    return [b for b in bins if any(_times(s, b.room) >= 1 for s in smallest)]


def _score(
    t: NodeTypeConfig, shape: ShapeKey, todo: Sequence[tuple[ShapeKey, int, str]]
) -> tuple[bool, int, float, float]:
    """Ray's utilization score of one node of type ``t`` for the demand still to place."""
    room = dict(t.resources)
    for s, count, _ in todo:
        k = min(count, _times(s, room))
        if k:
            _take(room, s, k)
    wants_gpu = any(k == "GPU" for k, _ in shape) or any(
        k == "GPU" for s, _, _ in todo for k, _v in s
    )
    gpu_ok = wants_gpu or t.resources.get("GPU", 0.0) <= 0
    utils = [(total - room.get(k, 0.0)) / total for k, total in t.resources.items() if total > 0]
    matching = sum(1 for k, _ in shape if k in t.resources)
    return (gpu_ok, matching, min(utils) if utils else 0.0, sum(utils) / max(len(utils), 1))


# -- the decision ----------------------------------------------------------------------------------
def decide(state: ClusterState, demand: Demand, config: ClusterConfig, now: float) -> Decision:
    """Launches and removals for this tick (see the module docstring)."""
    types = config.worker_types()
    nodes = list(state.nodes)
    live = [n for n in nodes if n.state != "draining"]
    count: Counter[str] = Counter(n.node_type for n in live if n.node_type is not None)
    for t, k in state.pending_launches.items():
        count[t] += k
    managed_total = sum(count.values())
    running_managed = sum(1 for n in live if n.node_type is not None and n.state == "running")
    launching = sum(1 for n in live if n.node_type is not None and n.state == "launching") + sum(
        state.pending_launches.values()
    )

    # 1. feasibility
    capacities = [dict(t.resources) for t in types.values()] + [dict(n.total) for n in live]
    infeasible: dict[ShapeKey, int] = {}
    items: list[tuple[ShapeKey, int, str]] = []
    agg: Counter[tuple[ShapeKey, str]] = Counter()
    for source, entries in (("queued", demand.pending), ("queued", demand.infeasible)):
        for shape, n in entries:
            key = shape_key(shape)
            if not key or n <= 0 or any("_group_" in k for k, _ in key):
                continue  # zero-resource requests, and requests for a group's reserved bundles
            agg[(key, source)] += n
    for (key, source), n in agg.items():
        if any(_fits(key, cap) for cap in capacities):
            items.append((key, n, source))
        else:
            infeasible[key] = infeasible.get(key, 0) + n
    pg_items: list[tuple[ShapeKey, int, str]] = []
    spread_groups: list[list[ShapeKey]] = []
    for pg in demand.placement_groups:
        bundles = [shape_key(b) for b in pg.bundles]
        bundles = [b for b in bundles if b]
        if pg.strategy == "STRICT_PACK":
            whole: Counter[str] = Counter()
            for b in bundles:
                for k, v in b:
                    whole[k] += v
            bundles = [shape_key(whole)] if whole else []
        bad = [b for b in bundles if not any(_fits(b, cap) for cap in capacities)]
        if bad:
            for b in bad:
                infeasible[b] = infeasible.get(b, 0) + 1
            continue
        if pg.strategy == "STRICT_SPREAD":
            spread_groups.append(bundles)
        else:
            pg_items.extend((b, 1, "placement group") for b in bundles)

    # 2. pack onto what exists (free resources of running nodes, all of launching ones)
    bins: list[_Bin] = []
    for n in live:
        room = dict(n.available if n.state == "running" else n.total)
        bins.append(_Bin(room, n, n.node_type, new=False))
    for t, k in state.pending_launches.items():
        if t in types:
            bins.extend(_Bin(dict(types[t].resources), None, t, new=False) for _ in range(k))
    todo = sorted(items + pg_items, key=lambda it: _size(it[0]), reverse=True)
    left = _pack(todo, bins)
    roomy = _with_room(spread_groups, bins) if spread_groups else []
    spread_left: list[list[ShapeKey]] = [_pack_distinct(g, roomy) for g in spread_groups]

    # 3. new nodes for what is left
    launch: Counter[str] = Counter()
    waiting: dict[tuple[ShapeKey, str], int] = {}
    speed_cap = max(MIN_PENDING_LAUNCHES, math.ceil(config.upscaling_speed * running_managed))
    budget = [max(0, speed_cap - launching)]

    def can_launch(name: str, capped: bool) -> str:
        """ "" when one more node of this type may be launched, else why not."""
        t = types[name]
        if count[name] + launch[name] >= t.max_workers:
            return f"node type {name} is at its max_workers ({t.max_workers})"
        if managed_total + sum(launch.values()) >= config.max_workers:
            return f"the cluster is at max_workers ({config.max_workers})"
        bo = state.backoff.get(name)
        if bo is not None and bo.retry_at > now:
            return (
                f"node type {name} failed to launch {bo.failures} time(s); retrying in "
                f"{bo.retry_at - now:.0f}s ({bo.last_error or 'no detail'})"
            )
        if capped and budget[0] <= 0:
            return f"{launching + sum(launch.values())} launches pending (upscaling_speed)"
        return ""

    def open_bin(
        shape: ShapeKey, rest: Sequence[tuple[ShapeKey, int, str]], capped: bool
    ) -> _Bin | str:
        candidates = [name for name, t in types.items() if _fits(shape, t.resources)]
        if not candidates:
            return "no worker node type can hold it (only an existing node can)"
        why = ""
        best: tuple[tuple[bool, int, float, float], str] | None = None
        for name in candidates:
            reason = can_launch(name, capped)
            if reason:
                why = why or reason
                continue
            score = _score(types[name], shape, rest)
            if best is None or score > best[0]:
                best = (score, name)
        if best is None:
            return why
        name = best[1]
        launch[name] += 1
        if capped:
            budget[0] -= 1
        b = _Bin(dict(types[name].resources), None, name, new=True)
        bins.append(b)
        return b

    def place_new(
        work: list[tuple[ShapeKey, int, str]], pool: list[_Bin], capped: bool, keep: bool
    ) -> None:
        """Pack ``work`` onto ``pool`` (bins opened for it), opening new nodes as needed."""
        for i, (shape, n, source) in enumerate(work):
            remaining = _pack([(shape, n, source)], pool, mark_used=not keep)
            while remaining:
                s, n_left, _src = remaining[0]
                b = open_bin(s, [remaining[0], *work[i + 1 :]], capped)
                if isinstance(b, str):
                    waiting[(s, b)] = waiting.get((s, b), 0) + n_left
                    break
                pool.append(b)
                remaining = _pack(remaining, [b], mark_used=not keep)

    new_bins: list[_Bin] = []
    place_new(left, new_bins, capped=True, keep=False)
    for group in spread_left:
        for shape in group:
            b = open_bin(shape, [(shape, 1, "placement group")], capped=True)
            if isinstance(b, str):
                waiting[(shape, b)] = waiting.get((shape, b), 0) + 1
                continue
            new_bins.append(b)
            _take(b.room, shape, 1)
            b.used = True
            b.sources[("placement group", shape)] += 1

    # 4. request_resources: pack onto totals, launch for the rest (not speed-capped)
    if demand.requested:
        req: Counter[ShapeKey] = Counter()
        for b, n in demand.requested:
            if shape_key(b) and n > 0:
                req[shape_key(b)] += n
        req_items = []
        for key, n in req.items():
            if any(_fits(key, cap) for cap in capacities):
                req_items.append((key, n, "request_resources"))
            else:
                infeasible[key] = infeasible.get(key, 0) + n
        req_items.sort(key=lambda it: _size(it[0]), reverse=True)
        total_bins = []
        for b in bins:
            if b.node is not None and b.node.state == "running":
                total_bins.append(_Bin(dict(b.node.total), b.node, b.node_type, new=False))
            else:
                total_bins.append(
                    _Bin(
                        dict(types[b.node_type].resources)
                        if b.node_type in types
                        else dict(b.node.total if b.node else {}),
                        b.node,
                        b.node_type,
                        new=b.new,
                    )
                )
        req_left = _pack(req_items, total_bins, mark_used=False)
        for tb, b in zip(total_bins, bins, strict=False):
            if tb.kept:
                b.kept = True
        place_new(req_left, [], capped=False, keep=True)

    # 5. min_workers
    for name, t in types.items():
        short = t.min_workers - (count[name] + launch[name])
        for _ in range(max(0, short)):
            if can_launch(name, capped=False):
                break
            launch[name] += 1
            bins.append(_Bin(dict(t.resources), None, name, new=True))

    # 6. termination
    terminate: list[tuple[str, str]] = []
    idle_timeout = config.idle_timeout_s
    kept_ids = {b.node.node_id for b in bins if b.node is not None and (b.used or b.kept)}
    remaining_count = Counter(count)
    for n in live:
        late = n.state == "launching" and now - n.launched_at > config.launch_timeout_s
        if n.node_type is not None and late:
            terminate.append(
                (n.node_id, f"did not join the cluster within {config.launch_timeout_s:g}s")
            )
            remaining_count[n.node_type] -= 1
    candidates = [
        n
        for n in live
        if n.node_type is not None
        and n.state == "running"
        and not n.busy
        and n.idle_since is not None
        and n.node_id not in kept_ids
    ]
    candidates.sort(key=lambda n: (n.idle_since, n.node_id))
    for n in candidates:
        assert n.node_type is not None and n.idle_since is not None
        t = types.get(n.node_type)
        idle_for = now - n.idle_since
        if t is None:
            reason = f"node type {n.node_type} is no longer in the config"
        elif remaining_count[n.node_type] > t.max_workers:
            reason = f"node type {n.node_type} is above its max_workers ({t.max_workers})"
        elif idle_for >= idle_timeout:
            if remaining_count[n.node_type] - 1 < t.min_workers:
                continue
            reason = f"idle for {idle_for:.0f}s (idle timeout {idle_timeout:g}s)"
        else:
            continue
        terminate.append((n.node_id, reason))
        remaining_count[n.node_type] -= 1

    # reports
    types_text = "; ".join(f"{name} {format_shape(t.resources)}" for name, t in types.items())
    infeasible_out = [
        Infeasible(
            key,
            n,
            f"no node type can ever hold {format_shape(key)} (node types: {types_text}); "
            "it is not launched for: lower the request or add a node type that fits",
        )
        for key, n in sorted(infeasible.items())
    ]
    reasons: dict[str, str] = {}
    for name in launch:
        src: Counter[tuple[str, ShapeKey]] = Counter()
        for b in bins:
            if b.new and b.node_type == name:
                src.update(b.sources)
        parts = [f"{k} x {format_shape(s)} {what}" for (what, s), k in src.most_common(3)]
        reasons[name] = ", ".join(parts) if parts else "min_workers"
    return Decision(
        launch=dict(launch),
        terminate=terminate,
        infeasible=infeasible_out,
        waiting=[Waiting(s, n, why) for (s, why), n in waiting.items()],
        reasons=reasons,
    )


def summarize(items: Iterable[tuple[Shape, int]]) -> dict[ShapeKey, int]:
    """Add up (shape, count) pairs by shape."""
    out: Counter[ShapeKey] = Counter()
    for shape, n in items:
        key = shape_key(shape)
        if key and n > 0:
            out[key] += n
    return dict(out)
