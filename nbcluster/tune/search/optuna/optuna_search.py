"""``OptunaSearch``: Optuna's samplers (TPE by default) behind Tune's ``Searcher`` interface.

The Tune search space (``tune.uniform``, ``tune.loguniform``, ``tune.choice``,
``tune.randint``, quantized variants; nested dicts) is converted to Optuna distributions;
each ``suggest`` asks the study for a trial, each result is reported to it as an
intermediate value, and each completed trial is told to it. ``optuna`` is imported when
an ``OptunaSearch`` is created (it is in the ``tune`` extra).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

from nbcluster.tune.search.sample import Categorical, Domain, Float, Function, Integer
from nbcluster.tune.search.searcher import Searcher
from nbcluster.tune.search.variant_generator import flatten_dict, format_path, validate_space

__all__ = ["OptunaSearch"]


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ImportError(
            "OptunaSearch needs optuna: pip install 'nbcluster[tune]' (or pip install optuna)"
        ) from None
    return optuna


def _sampler_parts(domain: Domain) -> tuple[str, float | None]:
    sampler = domain.get_sampler()
    q = getattr(sampler, "q", None)
    inner = getattr(sampler, "inner", sampler)
    return inner.name, q


def convert_search_space(space: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(distributions by flat key, constants by flat key)`` of a Tune search space."""
    ot = _optuna()
    dists: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    validate_space(space)
    for key, value in flatten_dict(space).items():
        where = format_path(tuple(key.split("/")))
        if isinstance(value, dict) and "grid_search" in value:
            raise ValueError(
                f"OptunaSearch cannot use grid_search (at {where}); use tune.choice([...]) instead"
            )
        if isinstance(value, Function):
            raise ValueError(f"OptunaSearch cannot use sample_from (at {where})")
        if isinstance(value, ot.distributions.BaseDistribution):
            dists[key] = value
            continue
        if not isinstance(value, Domain):
            constants[key] = value
            continue
        kind, q = _sampler_parts(value)
        if isinstance(value, Categorical):
            if value.is_grid():
                raise ValueError(f"OptunaSearch cannot use a grid domain (at {where})")
            dists[key] = ot.distributions.CategoricalDistribution(value.categories)
        elif isinstance(value, Float) and kind in ("Uniform", "LogUniform"):
            log = kind == "LogUniform"
            if log and q is not None:
                raise ValueError(
                    f"OptunaSearch does not support quantized log-uniform floats (at {where})"
                )
            dists[key] = ot.distributions.FloatDistribution(
                value.lower, value.upper, log=log, step=q
            )
        elif isinstance(value, Integer) and kind in ("Uniform", "LogUniform"):
            # Tune's randint excludes the upper bound; quantized ones include it.
            high = value.upper if q is not None and q != 1 else value.upper - 1
            dists[key] = ot.distributions.IntDistribution(
                value.lower, int(high), log=kind == "LogUniform", step=int(q or 1)
            )
        else:
            raise ValueError(
                f"OptunaSearch cannot convert {value!r} at {where} (normal distributions are "
                "not supported); use uniform, loguniform, randint, choice or their q-variants"
            )
    return dists, constants


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


class OptunaSearch(Searcher):
    """Tune's ``OptunaSearch``: suggest configs with an Optuna sampler (TPE by default).

    ``space``: a Tune search space (else the Tuner's ``param_space`` is used), a dict of
    Optuna distributions, or a define-by-run function ``space(optuna_trial)`` that may
    return a dict of constants. ``points_to_evaluate``: configs to try first
    (``evaluated_rewards``: their known results, which are told without running them).
    ``sampler``: an Optuna sampler; ``seed`` seeds the default TPE sampler.
    """

    def __init__(
        self,
        space: dict[str, Any] | Callable[[Any], dict[str, Any] | None] | None = None,
        metric: str | list[str] | None = None,
        mode: str | list[str] | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        sampler: Any = None,
        seed: int | None = None,
        evaluated_rewards: list[Any] | None = None,
    ) -> None:
        ot = _optuna()
        if isinstance(metric, list) or isinstance(mode, list):
            raise NotImplementedError("multi-objective OptunaSearch is not supported")
        super().__init__(metric=metric, mode=mode)
        self._ot = ot
        self._space_arg = space
        self._space: dict[str, Any] = {}
        self._constants: dict[str, Any] = {}
        self._define_by_run: Callable[[Any], Any] | None = None
        if callable(space):
            self._define_by_run = space
        elif space:
            self._space, self._constants = convert_search_space(space)
        self._points = [flatten_dict(p) for p in (points_to_evaluate or [])]
        self._evaluated_rewards = list(evaluated_rewards or [])
        if self._evaluated_rewards and len(self._evaluated_rewards) != len(self._points):
            raise ValueError(
                "evaluated_rewards must have one value per point in points_to_evaluate"
            )
        self._sampler = sampler or ot.samplers.TPESampler(seed=seed)
        self._study: Any = None
        self._ot_trials: dict[str, Any] = {}
        if self._metric and self._mode:
            self._setup_study()

    def _setup_study(self) -> None:
        ot = self._ot
        direction = "maximize" if self._mode == "max" else "minimize"
        self._study = ot.create_study(sampler=self._sampler, direction=direction)
        if self._evaluated_rewards:
            for point, reward in zip(self._points, self._evaluated_rewards, strict=True):
                self._study.add_trial(
                    ot.trial.create_trial(
                        params=point,
                        distributions={k: self._space[k] for k in point if k in self._space},
                        value=reward,
                    )
                )
            self._points = []
        for point in self._points:
            self._study.enqueue_trial(point)

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        if self._study is not None and not config:
            return False
        if metric:
            self._metric = self._metric or metric
        if mode:
            self._mode = self._mode or mode
        if not self._space and self._define_by_run is None and config:
            self._space, self._constants = convert_search_space(config)
        elif config and (self._space or self._define_by_run) and self._space_arg is not None:
            return False  # a space of its own and a param_space: the Tuner complains
        if self._study is None and self._mode:
            self._setup_study()
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._study is None:
            raise RuntimeError(
                "OptunaSearch has no metric/mode: pass them to OptunaSearch() or tune.TuneConfig()"
            )
        if self._define_by_run is not None:
            ot_trial = self._study.ask()
            extra = self._define_by_run(ot_trial) or {}
            params = {**dict(ot_trial.params), **flatten_dict(extra)}
        else:
            if not self._space:
                raise RuntimeError(
                    "OptunaSearch has no search space: pass space= or a param_space to the Tuner"
                )
            ot_trial = self._study.ask(fixed_distributions=self._space)
            params = dict(ot_trial.params)
        self._ot_trials[trial_id] = ot_trial
        return _unflatten({**copy.deepcopy(self._constants), **params})

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        value = result.get(self._metric or "")
        step = result.get("training_iteration")
        if ot_trial is None or not isinstance(value, (int, float)) or step is None:
            return
        # A step reported twice (after a restore) is refused by Optuna: nothing to do.
        with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):
            ot_trial.report(float(value), int(step))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        ot_trial = self._ot_trials.pop(trial_id, None)
        if ot_trial is None or self._study is None:
            return
        state = self._ot.trial.TrialState
        value = (result or {}).get(self._metric or "")
        if error or not isinstance(value, (int, float)):
            self._study.tell(ot_trial, state=state.FAIL)
        else:
            self._study.tell(ot_trial, float(value), state=state.COMPLETE)

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        if self._study is None:
            raise RuntimeError("OptunaSearch needs metric and mode before add_evaluated_point")
        ot = self._ot
        state = (
            ot.trial.TrialState.FAIL
            if error
            else (ot.trial.TrialState.PRUNED if pruned else ot.trial.TrialState.COMPLETE)
        )
        flat = flatten_dict(parameters)
        self._study.add_trial(
            ot.trial.create_trial(
                params=flat,
                distributions={k: self._space[k] for k in flat if k in self._space},
                value=None if error else value,
                intermediate_values=dict(enumerate(intermediate_values or [])),
                state=state,
            )
        )

    def get_state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_ot", None)
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ot = _optuna()

    def __getstate__(self) -> dict[str, Any]:
        return self.get_state()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.set_state(state)
