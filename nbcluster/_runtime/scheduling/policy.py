"""Where a lease request should run: a pure function of a cluster view (DESIGN §3).

``DEFAULT``: the local node while the request fits in what it has free; otherwise the
least-loaded node where it fits now; otherwise queue locally when the local node could
ever fit it; otherwise the least-loaded node that could ever fit it; otherwise infeasible.
``SPREAD``: the least-loaded node where it fits now (ties broken by node order, so the
choice rotates as load lands), else as DEFAULT.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

EPS = 1e-9

#: How a lease for an actor's worker names its owner: the head asks for it on the actor's
#: behalf (``owner_address`` is this prefix + the actor id in hex). Nodes tell actor leases
#: from task leases by it (the memory monitor never chooses an actor).
ACTOR_LEASE_OWNER = "head-actor:"


@dataclasses.dataclass(frozen=True)
class NodeView:
    """One node as the scheduler sees it."""

    node_id: bytes
    address: str
    total: Mapping[str, float]
    available: Mapping[str, float]
    alive: bool = True
    #: When the head received the report this view comes from (the head's clock; 0 when
    #: unknown). Only compared for equality: a new stamp means a newer report.
    stamp: float = 0.0


class Action(enum.Enum):
    """What to do with a request."""

    LOCAL = "local"  # grant here now, or queue here until resources free up
    SPILL = "spill"  # send the requester to another node
    INFEASIBLE = "infeasible"  # no node can ever fit this shape


@dataclasses.dataclass(frozen=True)
class Decision:
    """The policy's answer."""

    action: Action
    node: NodeView | None = None
    reason: str = ""


def fits(request: Mapping[str, float], resources: Mapping[str, float]) -> bool:
    """True when every requested amount is available in ``resources``."""
    return all(
        amount <= resources.get(name, 0.0) + EPS for name, amount in request.items() if amount > 0
    )


def load(node: NodeView) -> float:
    """Fraction of the node's resources in use (max over resource kinds that exist)."""
    worst = 0.0
    for name, total in node.total.items():
        if total > 0:
            worst = max(worst, 1.0 - node.available.get(name, 0.0) / total)
    return worst


def pick_node(
    request: Mapping[str, float],
    local: NodeView,
    others: Sequence[NodeView],
    strategy: str = "DEFAULT",
    allow_spill: bool = True,
) -> Decision:
    """Decide where ``request`` runs, given the local node and the rest of the cluster."""
    remote = [n for n in others if n.alive and n.node_id != local.node_id]
    candidates = [local, *remote] if allow_spill else [local]
    if strategy == "SPREAD":
        free_now = [n for n in candidates if fits(request, n.available)]
        if free_now:
            best = min(free_now, key=load)
            if best.node_id == local.node_id or load(best) < load(local) - EPS:
                return _to(best, local, "least loaded node (SPREAD)")
            return Decision(Action.LOCAL, local, "least loaded node (SPREAD)")
    if fits(request, local.available):
        return Decision(Action.LOCAL, local, "fits on the local node")
    if allow_spill:
        free_now = [n for n in remote if fits(request, n.available)]
        if free_now:
            return _to(
                min(free_now, key=load), local, "local node busy; least-loaded node with room"
            )
    if fits(request, local.total):
        return Decision(Action.LOCAL, local, "queued until the local node has room")
    if allow_spill:
        could = [n for n in remote if fits(request, n.total)]
        if could:
            return _to(min(could, key=load), local, "only other nodes can fit this request")
    return Decision(Action.INFEASIBLE, None, infeasible_message(request, [local, *remote]))


def _to(node: NodeView, local: NodeView, reason: str) -> Decision:
    if node.node_id == local.node_id:
        return Decision(Action.LOCAL, local, reason)
    return Decision(Action.SPILL, node, reason)


def infeasible_message(request: Mapping[str, float], nodes: Sequence[NodeView]) -> str:
    """Say what was asked for and what the cluster has."""
    asked = ", ".join(f"{k}: {v:g}" for k, v in sorted(request.items()) if v > 0) or "nothing"
    have: dict[str, float] = {}
    for n in nodes:
        for k, v in n.total.items():
            have[k] = max(have.get(k, 0.0), v)
    offered = ", ".join(f"{k}: {v:g}" for k, v in sorted(have.items())) or "no resources"
    return (
        f"no node can ever fit {{{asked}}}; the largest node has {{{offered}}}. "
        "It stays pending in case a node that fits joins; lower the request or add a node."
    )


# -- placement groups ------------------------------------------------------------------------
PG_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _take(avail: dict[str, float], req: Mapping[str, float]) -> None:
    for k, v in req.items():
        avail[k] = avail.get(k, 0.0) - v


def place_bundles(
    bundles: Sequence[Mapping[str, float]],
    nodes: Sequence[NodeView],
    strategy: str,
    use_total: bool = False,
) -> list[NodeView] | None:
    """Assign each bundle to a node, or None when the group cannot be placed (all or none).

    ``PACK`` puts bundles on as few nodes as possible (best effort), ``SPREAD`` on as many
    distinct nodes as possible (best effort), ``STRICT_PACK`` all on one node and
    ``STRICT_SPREAD`` each on a different node. ``use_total`` asks "could it ever fit?".
    """
    if strategy not in PG_STRATEGIES:
        raise ValueError(
            f"unknown placement strategy {strategy!r}; use one of {', '.join(PG_STRATEGIES)}"
        )
    live = [n for n in nodes if n.alive]
    room = {n.node_id: dict(n.total if use_total else n.available) for n in live}
    if strategy == "STRICT_PACK":
        need: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        fitting = [n for n in live if fits(need, room[n.node_id])]
        if not fitting:
            return None
        best = min(fitting, key=load)
        return [best for _ in bundles]
    if strategy == "STRICT_SPREAD" and len(bundles) > len(live):
        return None
    if strategy == "PACK":
        # One node for the whole group whenever one can hold it.
        need: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        whole = [n for n in live if fits(need, room[n.node_id])]
        if whole:
            best = min(whole, key=load)
            return [best for _ in bundles]
    return _search(bundles, live, room, strategy)


def _search(
    bundles: Sequence[Mapping[str, float]],
    live: Sequence[NodeView],
    room: dict[bytes, dict[str, float]],
    strategy: str,
    max_steps: int = 20_000,
) -> list[NodeView] | None:
    """Backtracking assignment (biggest bundles first) so a feasible group is always found.

    PACK tries nodes already used by the group first; SPREAD and STRICT_SPREAD try unused
    nodes first (STRICT_SPREAD never reuses one). Ties go to the least-loaded node.
    """
    order = sorted(range(len(bundles)), key=lambda i: -sum(bundles[i].values()))
    chosen: dict[int, NodeView] = {}
    count: dict[bytes, int] = {}
    steps = 0

    def candidates(b: Mapping[str, float]) -> list[NodeView]:
        cands = [n for n in live if fits(b, room[n.node_id])]
        if strategy == "STRICT_SPREAD":
            cands = [n for n in cands if not count.get(n.node_id)]
        if strategy == "PACK":
            cands.sort(key=lambda c: (-count.get(c.node_id, 0), load(c)))
        else:
            cands.sort(key=lambda c: (count.get(c.node_id, 0), load(c)))
        return cands

    def place(k: int) -> bool:
        nonlocal steps
        if k == len(order):
            return True
        i = order[k]
        for n in candidates(bundles[i]):
            steps += 1
            if steps > max_steps:
                return False
            _take(room[n.node_id], bundles[i])
            count[n.node_id] = count.get(n.node_id, 0) + 1
            chosen[i] = n
            if place(k + 1):
                return True
            for key, v in bundles[i].items():
                room[n.node_id][key] = room[n.node_id].get(key, 0.0) + v
            count[n.node_id] -= 1
            del chosen[i]
        return False

    if not place(0):
        return None
    return [chosen[i] for i in range(len(bundles))]


def bundle_resource_names(
    pg_hex: str, index: int, resources: Mapping[str, float]
) -> dict[str, float]:
    """The resources a committed bundle adds to its node: indexed and wildcard names (Ray's)."""
    out: dict[str, float] = {}
    for k, v in resources.items():
        if v <= 0:
            continue
        out[f"{k}_group_{index}_{pg_hex}"] = out.get(f"{k}_group_{index}_{pg_hex}", 0.0) + v
        out[f"{k}_group_{pg_hex}"] = out.get(f"{k}_group_{pg_hex}", 0.0) + v
    # A marker so that zero-resource tasks can target the bundle's node too.
    out[f"bundle_group_{index}_{pg_hex}"] = 1000.0
    out[f"bundle_group_{pg_hex}"] = out.get(f"bundle_group_{pg_hex}", 0.0) + 1000.0
    return out


def pg_request(resources: Mapping[str, float], pg_hex: str, index: int) -> dict[str, float]:
    """Rename a task's request to draw from a placement group's bundle (or any bundle)."""
    out: dict[str, float] = {}
    for k, v in resources.items():
        if v <= 0:
            continue
        out[f"{k}_group_{pg_hex}"] = v  # every bundle request also draws on the group total
        if index >= 0:
            out[f"{k}_group_{index}_{pg_hex}"] = v
    if not out:  # a zero-resource task still must land on a node of the group
        marker = "bundle"
        out[f"{marker}_group_{pg_hex}" if index < 0 else f"{marker}_group_{index}_{pg_hex}"] = 0.001
    return out
