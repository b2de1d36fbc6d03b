"""Search spaces, variant generation and their validation (no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from nbcluster import tune
from nbcluster.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
from nbcluster.tune.search.searcher import SearchGenerator
from nbcluster.tune.search.variant_generator import (
    count_variants,
    generate_variants,
    validate_space,
)


def draw(domain: object, n: int = 2000) -> np.ndarray:
    return np.array(domain.sample(size=n, random_state=0))  # type: ignore[attr-defined]


def test_sampling_follows_rays_bounds() -> None:
    assert set(draw(tune.randint(0, 3))) == {0, 1, 2}  # upper excluded
    assert set(draw(tune.qrandint(0, 10, 5))) == {0, 5, 10}  # quantized: upper included
    u = draw(tune.uniform(-1, 1))
    assert u.min() >= -1 and u.max() <= 1
    q = draw(tune.quniform(0, 1, 0.25))
    assert set(np.round(q, 6)) <= {0.0, 0.25, 0.5, 0.75, 1.0}
    lu = draw(tune.loguniform(1e-4, 1e-1))
    assert lu.min() >= 1e-4 and lu.max() <= 1e-1 and np.median(lu) < 1e-2  # log-spread
    li = draw(tune.lograndint(1, 100))
    assert li.min() >= 1 and li.max() <= 99
    assert set(draw(tune.qlograndint(10, 100, 10))) <= set(range(10, 101, 10))
    assert set(draw(tune.choice(["a", "b"]))) == {"a", "b"}
    n = draw(tune.randn(5.0, 0.1))
    assert abs(n.mean() - 5.0) < 0.05
    assert set(np.round(draw(tune.qrandn(0, 1, 0.5)) / 0.5, 6)) <= set(range(-20, 21))
    assert isinstance(tune.randint(0, 3).sample(random_state=0), int)
    assert isinstance(tune.uniform(0, 1).sample(random_state=0), float)


def test_grid_expands_first_key_fastest_and_resolves_everything() -> None:
    space = {
        "a": tune.grid_search([1, 2]),
        "b": tune.grid_search(["x", "y"]),
        "c": tune.uniform(0, 1),
        "nested": {"d": tune.sample_from(lambda config: config["a"] * 10)},
        "const": 7,
    }
    assert count_variants(space) == 4
    variants = list(generate_variants(space, np.random.default_rng(0)))
    assert [(c["a"], c["b"]) for _, c in variants] == [(1, "x"), (2, "x"), (1, "y"), (2, "y")]
    for resolved, config in variants:
        assert config["nested"]["d"] == config["a"] * 10
        assert 0 <= config["c"] <= 1 and config["const"] == 7
        assert resolved[("a",)] == config["a"]


def test_sample_from_old_spec_style() -> None:
    space = {"a": 3, "b": tune.sample_from(lambda spec: spec.config.a + 1)}
    ((_, config),) = list(generate_variants(space, np.random.default_rng(0)))
    assert config["b"] == 4


@pytest.mark.parametrize(
    ("space", "where", "what"),
    [
        ({"lr": tune.loguniform(0, 1)}, "param_space['lr']", "lower bound > 0"),
        ({"m": {"lr": tune.uniform(5, 1)}}, "param_space['m']['lr']", "must not be above"),
        ({"a": tune.grid_search([])}, "param_space['a']", "at least one value"),
        ({"a": {"grid_search": 3}}, "param_space['a']", "needs a list"),
        ({"a": tune.choice([])}, "param_space['a']", "at least one category"),
        ({"n": tune.randint(3, 3)}, "param_space['n']", "upper bound"),
        ({"f": tune.sample_from(3)}, "param_space['f']", "needs a function"),
        ({"q": tune.qrandint(1, 3, 5)}, "param_space['q']", "no multiple of q=5"),
        ({"s": tune.randn(0, -1)}, "param_space['s']", "standard deviation"),
    ],
)
def test_invalid_space_names_the_key(space: dict, where: str, what: str) -> None:
    with pytest.raises(ValueError, match="Invalid search space at") as info:
        validate_space(space)
    assert where in str(info.value) and what in str(info.value)


def test_invalid_space_fails_at_tuner() -> None:
    def f(config: dict) -> None: ...

    with pytest.raises(ValueError, match=r"param_space\['opt'\]\['lr'\].*lower bound > 0"):
        tune.Tuner(f, param_space={"opt": {"lr": tune.loguniform(0.0, 1.0)}})


def test_basic_variant_generator_counts_samples_points_and_concurrency() -> None:
    gen = BasicVariantGenerator(points_to_evaluate=[{"x": 0.5}], random_state=1, max_concurrent=2)
    gen.setup({"x": tune.uniform(0, 1), "g": tune.grid_search([1, 2])}, num_samples=2)
    assert gen.total_samples == 4
    s0 = gen.next_config("t0")
    s1 = gen.next_config("t1")
    assert s0 is not None and s1 is not None
    assert s0.config["x"] == s1.config["x"] == 0.5  # the point, across its grid
    assert gen.next_config("t2") is None  # max_concurrent
    gen.on_trial_complete("t0")
    s2 = gen.next_config("t2")
    gen.on_trial_complete("t1")
    s3 = gen.next_config("t3")
    assert s2 is not None and s3 is not None
    assert 0.5 not in (s2.config["x"], s3.config["x"]) and {s2.config["g"], s3.config["g"]} == {
        1,
        2,
    }
    gen.on_trial_complete("t2")
    assert gen.next_config("t4") is None and gen.is_finished()
    gen.set_num_samples(3)  # fit() again after raising num_samples
    assert not gen.is_finished() and gen.next_config("t5") is not None


def test_constant_grid_search_keeps_draws_across_the_grid() -> None:
    gen = BasicVariantGenerator(constant_grid_search=True, random_state=0)
    gen.setup({"x": tune.uniform(0, 1), "g": tune.grid_search([1, 2, 3])}, num_samples=1)
    xs = {gen.next_config(f"t{i}").config["x"] for i in range(3)}  # type: ignore[union-attr]
    assert len(xs) == 1


class _Counting(Searcher):
    def __init__(self) -> None:
        super().__init__(metric="m", mode="max")
        self.n = 0
        self.completed: list[str] = []

    def suggest(self, trial_id: str) -> dict:
        self.n += 1
        return {"x": self.n}

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self.completed.append(trial_id)


def test_concurrency_limiter_and_batch() -> None:
    inner = _Counting()
    lim = ConcurrencyLimiter(inner, max_concurrent=2, batch=True)
    assert lim.suggest("a") == {"x": 1} and lim.suggest("b") == {"x": 2}
    assert lim.suggest("c") is None
    lim.on_trial_complete("a", {"m": 1})
    assert inner.completed == [] and lim.suggest("c") is None  # batch: waits for b
    lim.on_trial_complete("b", {"m": 2})
    assert inner.completed == ["a", "b"] and lim.suggest("c") == {"x": 3}
    with pytest.raises(ValueError, match="max_concurrent"):
        ConcurrencyLimiter(inner, max_concurrent=0)


def test_search_generator_merges_constants_and_counts() -> None:
    gen = SearchGenerator(_Counting())
    gen.setup({"x": tune.uniform(0, 1), "const": 5, "other": tune.choice([7])}, num_samples=2)
    s = gen.next_config("a")
    assert s is not None and s.config == {"x": 1, "const": 5, "other": 7}
    assert gen.next_config("b") is not None and gen.next_config("c") is None and gen.is_finished()
