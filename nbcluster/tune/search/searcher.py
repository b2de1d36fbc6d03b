"""Search algorithms: the ``Searcher`` interface, ``ConcurrencyLimiter``, ``SearchGenerator``.

Two layers, as in Ray:

- a :class:`Searcher` suggests one config at a time (``suggest(trial_id)``) and learns
  from results (``on_trial_result``, ``on_trial_complete``). ``OptunaSearch`` is one.
- a :class:`SearchAlgorithm` is what the controller talks to: it hands out the next trial's
  config (``next_config``), knows when the search is finished, and holds ``num_samples``.
  :class:`SearchGenerator` turns a ``Searcher`` into one;
  :class:`~nbcluster.tune.search.basic_variant.BasicVariantGenerator` (the default) is one.

Every object here lives in the driver and holds no process or socket: the controller's
state machine calls it, and tests drive it with synthetic results.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np

from nbcluster.tune.search.variant_generator import flatten_dict, parse_space, resolve_config

__all__ = ["ConcurrencyLimiter", "SearchAlgorithm", "SearchGenerator", "Searcher", "Suggestion"]


class Suggestion:
    """A config handed to the controller for a new trial."""

    __slots__ = ("config", "resolved_vars", "trial_id")

    def __init__(
        self, trial_id: str, config: dict[str, Any], resolved_vars: dict[Any, Any]
    ) -> None:
        self.trial_id = trial_id
        self.config = config
        self.resolved_vars = resolved_vars

    def __repr__(self) -> str:
        return f"Suggestion({self.trial_id!r}, {self.config!r})"


class Searcher:
    """Base class of search algorithms that suggest one config at a time (Ray's ``Searcher``).

    Subclasses implement :meth:`suggest` and usually :meth:`on_trial_complete`.
    ``suggest`` returns a config dict, ``None`` when it has nothing to suggest right now
    (e.g. waiting for results), or :attr:`FINISHED` when the search is over.
    """

    FINISHED = "FINISHED"
    CKPT_FILE_TMPL = "searcher-state-{}.pkl"

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> str | None:
        """The metric the searcher optimizes."""
        return self._metric

    @property
    def mode(self) -> str | None:
        """``'min'`` or ``'max'``."""
        return self._mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """Take metric, mode and the search space from ``TuneConfig``/``param_space``.

        Returns False when the searcher already has its own (the Tuner then raises if
        they conflict)."""
        return False

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Let the searcher limit its own concurrency; False means it cannot."""
        return False

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """A config for the new trial ``trial_id``, None for "not now", or FINISHED."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An intermediate result of a trial."""

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """A trial finished (``error=True`` when it failed); ``result`` is its last one."""

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        """Tell the searcher about a config evaluated outside this search."""
        raise NotImplementedError(f"{type(self).__name__} does not support add_evaluated_point")

    def on_pause(self, trial_id: str) -> None:
        """A trial was paused by the scheduler."""

    def on_unpause(self, trial_id: str) -> None:
        """A paused trial runs again."""

    def get_state(self) -> dict[str, Any]:
        """The searcher's state (default: its attributes)."""
        return copy.copy(self.__dict__)

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned."""
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        """Write the searcher's state to a file."""
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        """Read the state :meth:`save` wrote."""
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))


class ConcurrencyLimiter(Searcher):
    """Let at most ``max_concurrent`` trials of ``searcher`` run at once (Ray's semantics).

    With ``batch=True`` the wrapped searcher hears about completed trials only when the
    whole batch of ``max_concurrent`` trials has finished.
    """

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                f"ConcurrencyLimiter only wraps Searcher objects, got {type(searcher).__name__}; "
                "pass max_concurrent_trials to TuneConfig instead"
            )
        if (
            not isinstance(max_concurrent, int)
            or isinstance(max_concurrent, bool)
            or max_concurrent < 1
        ):
            raise ValueError(f"max_concurrent must be an integer >= 1, got {max_concurrent!r}")
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.batch = batch
        self.live_trials: set[str] = set()
        self.num_unfinished_live_trials = 0
        self.cached_results: dict[str, tuple[dict[str, Any] | None, bool]] = {}
        self._limit_concurrency = not searcher.set_max_concurrency(max_concurrent)
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    @property
    def metric(self) -> str | None:
        return self.searcher.metric

    @property
    def mode(self) -> str | None:
        return self.searcher.mode

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.max_concurrent = max_concurrent
        return True

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        self._limit_concurrency = not self.searcher.set_max_concurrency(self.max_concurrent)
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self._limit_concurrency:
            return self.searcher.suggest(trial_id)
        if len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if suggestion not in (None, Searcher.FINISHED):
            self.live_trials.add(trial_id)
            self.num_unfinished_live_trials += 1
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if not self._limit_concurrency:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            return
        if trial_id not in self.live_trials:
            return
        if self.batch:
            self.cached_results[trial_id] = (result, error)
            self.num_unfinished_live_trials -= 1
            if self.num_unfinished_live_trials > 0:
                return
            for tid, (res, err) in self.cached_results.items():
                self.searcher.on_trial_complete(tid, result=res, error=err)
                self.live_trials.discard(tid)
            self.cached_results = {}
            self.num_unfinished_live_trials = 0
            return
        self.searcher.on_trial_complete(trial_id, result=result, error=error)
        self.live_trials.discard(trial_id)
        self.num_unfinished_live_trials -= 1

    def add_evaluated_point(self, *args: Any, **kwargs: Any) -> None:
        self.searcher.add_evaluated_point(*args, **kwargs)

    def on_pause(self, trial_id: str) -> None:
        self.searcher.on_pause(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self.searcher.on_unpause(trial_id)


class SearchAlgorithm:
    """What the controller asks for new trials (Ray's ``SearchAlgorithm`` interface)."""

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """Take metric, mode and search space from the Tuner."""
        return True

    def setup(self, param_space: dict[str, Any], num_samples: int) -> None:
        """Receive the param space and the number of samples (called by the Tuner)."""
        raise NotImplementedError

    def set_num_samples(self, num_samples: int) -> None:
        """Change ``num_samples`` (a second ``fit()`` after raising it continues the search)."""
        raise NotImplementedError

    def next_config(self, trial_id: str) -> Suggestion | None:
        """The config of the next trial, or None (nothing now, or finished)."""
        raise NotImplementedError

    def is_finished(self) -> bool:
        """True when no more trials will come."""
        raise NotImplementedError

    def set_finished(self) -> None:
        """Stop suggesting trials."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """An intermediate result."""

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """A trial finished."""

    @property
    def total_samples(self) -> int | None:
        """How many trials the search will make in all (None: not known)."""
        return None


class SearchGenerator(SearchAlgorithm):
    """Adapts a :class:`Searcher` to the controller: counts samples up to ``num_samples``."""

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self._num_samples = 1
        self._counter = 0
        self._finished = False
        self._space: dict[str, Any] = {}
        self._rng = np.random.default_rng()

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def setup(self, param_space: dict[str, Any], num_samples: int) -> None:
        self._num_samples = num_samples
        self._space = copy.deepcopy(param_space or {})

    def next_config(self, trial_id: str) -> Suggestion | None:
        if self.is_finished():
            return None
        config = self.searcher.suggest(trial_id)
        if config == Searcher.FINISHED:
            self._finished = True
            return None
        if config is None:
            return None
        if not isinstance(config, dict):
            raise TypeError(
                f"{type(self.searcher).__name__}.suggest() must return a dict, None or "
                f"Searcher.FINISHED; got {type(config).__name__}"
            )
        self._counter += 1
        # The suggestion overrides the param space; constants (and anything the searcher
        # does not handle) come from the space, as in Ray's SearchGenerator.
        merged = _merge(self._space, config)
        _, leftovers = parse_space(merged)
        resolve_config(merged, leftovers, self._rng)
        flat_suggested = flatten_dict(config)
        resolved = {tuple(k.split("/")): v for k, v in flat_suggested.items()}
        return Suggestion(trial_id, merged, resolved)

    def is_finished(self) -> bool:
        if self._num_samples >= 0 and self._counter >= self._num_samples:
            return True
        return self._finished

    def set_finished(self) -> None:
        self._finished = True

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def set_num_samples(self, num_samples: int) -> None:
        """Set ``num_samples`` (raising it on an experiment that ran continues it)."""
        if num_samples != self._num_samples:
            self._finished = False
        self._num_samples = num_samples

    @property
    def total_samples(self) -> int | None:
        return self._num_samples if self._num_samples >= 0 else None


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
