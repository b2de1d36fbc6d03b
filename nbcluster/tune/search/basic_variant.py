"""The default search: grid expansion times ``num_samples`` random draws (Ray's semantics)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from nbcluster.tune.search.sample import rng
from nbcluster.tune.search.searcher import SearchAlgorithm, Suggestion
from nbcluster.tune.search.variant_generator import (
    Path,
    assign_value,
    count_variants,
    generate_variants,
    parse_space,
    resolve_config,
    validate_space,
)

__all__ = ["BasicVariantGenerator"]


def _deep_update(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if (
            isinstance(value, dict)
            and isinstance(out.get(key), dict)
            and "grid_search" not in value
        ):
            out[key] = _deep_update(out[key], value)
        else:
            out[key] = value
    return out


class BasicVariantGenerator(SearchAlgorithm):
    """Random search over the param space, with every ``grid_search`` fully expanded.

    Each of the ``num_samples`` samples expands every grid combination (the first grid key
    changing fastest) and draws the sampled parameters afresh, so the number of trials is
    ``num_samples`` times the size of the grid; ``num_samples=-1`` repeats forever.
    ``points_to_evaluate`` are partial configs run first. ``max_concurrent`` (0 = no
    limit) caps how many of its trials run at once. ``constant_grid_search=True`` draws
    the random parameters once per sample and keeps them across that sample's grid.
    ``random_state`` seeds the draws (an int, a numpy ``Generator`` or ``RandomState``).
    """

    def __init__(
        self,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        max_concurrent: int = 0,
        constant_grid_search: bool = False,
        random_state: Any = None,
    ) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 0:
            raise ValueError(f"max_concurrent must be an integer >= 0, got {max_concurrent!r}")
        self._points = [dict(p) for p in (points_to_evaluate or [])]
        self.max_concurrent = max_concurrent
        self._constant_grid_search = constant_grid_search
        self._rng: np.random.Generator = rng(random_state)
        self._space: dict[str, Any] = {}
        self._num_samples = 1
        self._samples_started = 0
        self._queue: list[tuple[dict[Path, Any], dict[str, Any]]] = []
        self._live: set[str] = set()
        self._finished = False
        self._grid_size = 1
        self._total_made = 0

    def setup(self, param_space: dict[str, Any], num_samples: int) -> None:
        validate_space(param_space)
        self._space = copy.deepcopy(param_space or {})
        self._grid_size = count_variants(self._space)
        self.set_num_samples(num_samples)

    def set_num_samples(self, num_samples: int) -> None:
        """Set ``num_samples`` (raising it on an experiment that ran continues it)."""
        self._num_samples = num_samples
        if num_samples < 0 or self._samples_started < max(num_samples, len(self._points)):
            self._finished = False

    @property
    def total_samples(self) -> int | None:
        if self._num_samples < 0:
            return None
        return max(self._num_samples, len(self._points)) * self._grid_size

    def _next_sample(self) -> bool:
        """Expand one more sample into the queue; False when all samples are out."""
        limit = max(self._num_samples, len(self._points))
        if self._num_samples >= 0 and self._samples_started >= limit:
            return False
        i = self._samples_started
        self._samples_started += 1
        space = self._space
        if i < len(self._points):
            space = _deep_update(space, self._points[i])
        if self._constant_grid_search:
            variants = self._constant_variants(space)
        else:
            variants = list(generate_variants(space, self._rng))
        self._queue.extend(variants)
        return True

    def _constant_variants(
        self, space: dict[str, Any]
    ) -> list[tuple[dict[Path, Any], dict[str, Any]]]:
        _, domains = parse_space(space)
        fixed = copy.deepcopy(space)
        drawn = resolve_config(
            fixed, [(p, d) for p, d in domains if not d.is_function()], self._rng
        )
        out = []
        for resolved, config in generate_variants(fixed, self._rng):
            for path, value in drawn.items():
                assign_value(config, path, value)
            out.append(({**drawn, **resolved}, config))
        return out

    def next_config(self, trial_id: str) -> Suggestion | None:
        if self._finished:
            return None
        if self.max_concurrent and len(self._live) >= self.max_concurrent:
            return None
        if not self._queue and not self._next_sample():
            self._finished = True
            return None
        resolved, config = self._queue.pop(0)
        self._live.add(trial_id)
        self._total_made += 1
        return Suggestion(trial_id, config, resolved)

    def is_finished(self) -> bool:
        if self._finished:
            return True
        limit = max(self._num_samples, len(self._points))
        return not self._queue and self._num_samples >= 0 and self._samples_started >= limit

    def set_finished(self) -> None:
        self._finished = True

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._live.discard(trial_id)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        pass
