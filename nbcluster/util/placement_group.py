"""Placement groups: reserve bundles of resources across nodes, all or nothing.

pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
nbcluster.get(pg.ready())             # or pg.wait(timeout_seconds=10)
f.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
remove_placement_group(pg)           # ends the tasks and actors running in it
"""

from __future__ import annotations

from typing import Any

from nbcluster._api import get, wait
from nbcluster._refs import ObjectRef
from nbcluster._runtime import context
from nbcluster._runtime.scheduling.policy import PG_STRATEGIES
from nbcluster.exceptions import NbclusterError

__all__ = [
    "PlacementGroup",
    "placement_group",
    "remove_placement_group",
    "get_placement_group",
    "placement_group_table",
]


class PlacementGroup:
    """A handle to a placement group (created with :func:`placement_group`)."""

    def __init__(self, pg_id: bytes, bundles: list[dict[str, float]], name: str = "") -> None:
        self.id = pg_id
        self.bundle_specs = bundles
        self.name = name

    @property
    def bundle_count(self) -> int:
        """Number of bundles."""
        return len(self.bundle_specs)

    def ready(self) -> ObjectRef:
        """A ref that becomes ready (with value True) once every bundle is reserved."""
        return context.require_driver().placement_group_ready(self.id)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """Block until the group is created (True) or ``timeout_seconds`` pass (False)."""
        ref = self.ready()
        ready, _ = wait([ref], timeout=timeout_seconds)
        if not ready:
            return False
        try:
            return get(ref) is True
        except NbclusterError:
            return False  # removed before it was created

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlacementGroup, (self.id, self.bundle_specs, self.name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id.hex()}, bundles={self.bundle_specs})"


def _check_bundles(bundles: Any) -> list[dict[str, float]]:
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise ValueError("bundles must be a non-empty list of dicts, e.g. [{'CPU': 1}, {'CPU': 1}]")
    out = []
    for i, b in enumerate(bundles):
        if not isinstance(b, dict) or not b:
            raise ValueError(
                f"bundle {i} must be a non-empty dict of resource -> amount, got {b!r}"
            )
        clean: dict[str, float] = {}
        for k, v in b.items():
            if (
                not isinstance(k, str)
                or isinstance(v, bool)
                or not isinstance(v, (int, float))
                or v < 0
            ):
                raise ValueError(f"bundle {i}: {k!r} must map to a non-negative number, got {v!r}")
            if v > 0:
                clean[k] = float(v)
        if not clean:
            raise ValueError(f"bundle {i} reserves nothing: every amount is 0")
        out.append(clean)
    return out


def placement_group(
    bundles: list[dict[str, float]],
    strategy: str = "PACK",
    name: str = "",
    lifetime: str | None = None,
) -> PlacementGroup:
    """Ask the cluster to reserve ``bundles`` with ``strategy``; returns at once.

    ``strategy``: ``PACK`` (few nodes, best effort), ``SPREAD`` (many nodes, best effort),
    ``STRICT_PACK`` (one node), ``STRICT_SPREAD`` (one node per bundle). A group that
    cannot be placed stays pending (see :func:`placement_group_table`). ``lifetime=
    "detached"`` keeps it after this driver exits.
    """
    specs = _check_bundles(bundles)
    if strategy not in PG_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(PG_STRATEGIES)}, got {strategy!r}")
    if lifetime not in (None, "detached"):
        raise ValueError(f"lifetime must be None or 'detached', got {lifetime!r}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    driver = context.require_driver()
    pg_id = driver.create_placement_group(specs, strategy, name, lifetime == "detached")
    return PlacementGroup(pg_id, specs, name)


def remove_placement_group(pg: PlacementGroup) -> None:
    """Release the group's resources; tasks and actors running in it are ended."""
    if not isinstance(pg, PlacementGroup):
        raise TypeError(
            f"remove_placement_group() expects a PlacementGroup, got {type(pg).__name__}"
        )
    context.require_driver().remove_placement_group(pg.id)


def get_placement_group(name: str) -> PlacementGroup:
    """The live placement group called ``name`` (in the job's namespace)."""
    pg_id, bundles, found = context.require_driver().get_placement_group(name)
    return PlacementGroup(pg_id, bundles, found)


def placement_group_table(pg: PlacementGroup | None = None) -> dict[str, Any]:
    """State of one group, or of all groups keyed by id."""
    rows = context.require_driver().placement_group_table(None if pg is None else pg.id)
    if pg is not None:
        return rows[0]
    return {row["placement_group_id"]: row for row in rows}
