"""Search-space primitives: ``uniform``, ``choice``, ``randint``, ``grid_search``... as in Ray.

A :class:`Domain` says what values a parameter may take (``Float``, ``Integer``,
``Categorical``, ``Function``) and its sampler says how to draw them (uniform, log-uniform,
normal, quantized, grid). Names, bounds and rounding follow ``ray.tune.search.sample``:
``randint`` excludes its upper bound, ``qrandint``/``quniform`` include it, ``loguniform``
needs positive bounds.

Unlike Ray, the constructors do not raise on bad bounds: a domain records what is wrong
(:meth:`Domain.problems`) and ``Tuner(...)`` raises one ``ValueError`` that names the key of
the parameter, which a constructor cannot know.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from copy import copy
from typing import Any

import numpy as np

__all__ = [
    "Categorical",
    "Domain",
    "Float",
    "Function",
    "Integer",
    "choice",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
    "rng",
]


def rng(random_state: Any = None) -> np.random.Generator:
    """A numpy ``Generator`` from a seed, a ``Generator`` or a legacy ``RandomState``."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    return np.random.default_rng(random_state)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


class _Sampler:
    """How values are drawn from a domain (subclasses below)."""

    name = "base"

    def problems(self, domain: Domain) -> list[str]:
        """What makes sampling impossible (empty when fine)."""
        return []

    def draw(self, domain: Any, g: np.random.Generator, size: int) -> np.ndarray | list[Any]:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


class _Uniform(_Sampler):
    name = "Uniform"

    def problems(self, domain: Domain) -> list[str]:
        lower, upper = getattr(domain, "lower", 0), getattr(domain, "upper", 1)
        if isinstance(domain, Categorical):
            return [] if domain.categories else ["choice() needs at least one category"]
        if not (_is_number(lower) and _is_number(upper)):
            return [f"bounds must be numbers, got lower={lower!r}, upper={upper!r}"]
        if not (math.isfinite(lower) and math.isfinite(upper)):
            return ["uniform sampling needs finite lower and upper bounds"]
        if isinstance(domain, Integer) and upper <= lower:
            return [f"the upper bound {upper} (excluded) must be above the lower bound {lower}"]
        if upper < lower:
            return [f"the lower bound {lower} must not be above the upper bound {upper}"]
        return []

    def draw(self, domain: Any, g: np.random.Generator, size: int) -> Any:
        if isinstance(domain, Categorical):
            idx = g.integers(0, len(domain.categories), size=size)
            return [domain.categories[i] for i in idx]
        if isinstance(domain, Integer):
            return g.integers(domain.lower, domain.upper, size=size)
        return g.uniform(domain.lower, domain.upper, size=size)


class _LogUniform(_Sampler):
    name = "LogUniform"

    def problems(self, domain: Domain) -> list[str]:
        lower, upper = getattr(domain, "lower", None), getattr(domain, "upper", None)
        if not (_is_number(lower) and _is_number(upper)):
            return [f"bounds must be numbers, got lower={lower!r}, upper={upper!r}"]
        if not lower > 0:
            return [
                f"log-uniform sampling needs a lower bound > 0, got {lower} "
                "(pass the value itself, not its logarithm)"
            ]
        if not (math.isfinite(upper) and upper > lower):
            return [f"the upper bound {upper} must be finite and above the lower bound {lower}"]
        return []

    def draw(self, domain: Any, g: np.random.Generator, size: int) -> Any:
        values = np.exp(g.uniform(np.log(domain.lower), np.log(domain.upper), size=size))
        if isinstance(domain, Integer):
            return np.minimum(np.floor(values).astype(np.int64), domain.upper - 1)
        return values


class _Normal(_Sampler):
    name = "Normal"

    def __init__(self, mean: float, sd: float) -> None:
        self.mean = mean
        self.sd = sd

    def problems(self, domain: Domain) -> list[str]:
        if not (_is_number(self.mean) and _is_number(self.sd)):
            return [f"mean and sd must be numbers, got mean={self.mean!r}, sd={self.sd!r}"]
        if not self.sd > 0:
            return [f"the standard deviation must be > 0, got {self.sd}"]
        return []

    def draw(self, domain: Any, g: np.random.Generator, size: int) -> Any:
        return g.normal(self.mean, self.sd, size=size)


class _Grid(_Sampler):
    name = "Grid"

    def draw(self, domain: Any, g: np.random.Generator, size: int) -> Any:
        raise RuntimeError("a grid domain is expanded, never sampled")


class _Quantized(_Sampler):
    def __init__(self, inner: _Sampler, q: float) -> None:
        self.inner = inner
        self.q = q
        self.name = f"Quantized({inner.name}, q={q})"

    def problems(self, domain: Domain) -> list[str]:
        if not _is_number(self.q) or not self.q > 0:
            return [f"the quantization step q must be a number > 0, got {self.q!r}"]
        out = self.inner.problems(domain)
        if out:
            return out
        if isinstance(domain, Integer):
            lo, hi = self._index(domain.lower, math.ceil), self._index(domain.upper, math.floor)
            if hi < lo:
                return [
                    f"there is no multiple of q={self.q} between {domain.lower} and {domain.upper}"
                ]
        return []

    def _index(self, bound: float, round_fn: Callable[[float], float]) -> float:
        if not math.isfinite(bound):
            return bound
        scaled = bound / self.q
        nearest = round(scaled)
        return nearest if math.isclose(scaled, nearest) else round_fn(scaled)

    def draw(self, domain: Any, g: np.random.Generator, size: int) -> Any:
        if isinstance(domain, Integer):
            index_domain = copy(domain)
            index_domain.lower = int(self._index(domain.lower, math.ceil))
            # Samplers exclude the upper bound; quantization includes it (except q == 1).
            index_domain.upper = int(self._index(domain.upper, math.floor)) + (
                0 if self.q == 1 else 1
            )
            return np.multiply(self.inner.draw(index_domain, g, size), self.q)
        inner_domain = copy(domain)
        inner_domain.lower = self._index(domain.lower, math.ceil) * self.q
        inner_domain.upper = self._index(domain.upper, math.floor) * self.q
        values = self.inner.draw(inner_domain, g, size)
        return np.round(np.divide(values, self.q)) * self.q


class Domain:
    """A parameter's possible values and how to sample them (see the module docstring)."""

    sampler: _Sampler | None = None
    default_sampler_cls: type[_Sampler] = _Uniform

    def cast(self, value: Any) -> Any:
        """Convert a drawn value to the domain's type."""
        return value

    def set_sampler(self, sampler: _Sampler, allow_override: bool = False) -> None:
        """Choose the sampler (only once, unless ``allow_override``)."""
        if self.sampler is not None and not allow_override:
            raise ValueError(
                f"You can only choose one sampler for parameter domains. Existing sampler for "
                f"parameter {type(self).__name__}: {self.sampler}. Tried to add {sampler}"
            )
        self.sampler = sampler

    def get_sampler(self) -> _Sampler:
        """The chosen sampler, or the domain's default one."""
        return self.sampler if self.sampler is not None else self.default_sampler_cls()

    def sample(
        self, config: dict[str, Any] | None = None, size: int = 1, random_state: Any = None
    ) -> Any:
        """Draw ``size`` values (one value when ``size == 1``)."""
        bad = self.problems()
        if bad:
            raise ValueError(f"cannot sample {self!r}: {bad[0]}")
        g = rng(random_state)
        items = [self.cast(v) for v in self.get_sampler().draw(self, g, size)]
        return items if size > 1 else items[0]

    def problems(self) -> list[str]:
        """What is wrong with this domain (empty when it can be sampled)."""
        return self.get_sampler().problems(self)

    def is_grid(self) -> bool:
        """True for a grid domain (expanded into one trial per value)."""
        return isinstance(self.sampler, _Grid)

    def is_function(self) -> bool:
        """True for ``sample_from``."""
        return False

    def is_valid(self, value: Any) -> bool:
        """True when ``value`` lies in the domain."""
        raise NotImplementedError

    @property
    def domain_str(self) -> str:
        """A short text of the domain's range."""
        return "(unknown)"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.domain_str} {self.get_sampler()}>"


class Float(Domain):
    """A real-valued range ``[lower, upper]`` (None = unbounded)."""

    def __init__(self, lower: float | None, upper: float | None) -> None:
        self.lower = lower if lower is not None else float("-inf")
        self.upper = upper if upper is not None else float("inf")

    def cast(self, value: Any) -> float:
        return float(value)

    def uniform(self) -> Float:
        """Sample uniformly."""
        new = copy(self)
        new.set_sampler(_Uniform())
        return new

    def loguniform(self, base: object = None) -> Float:
        """Sample uniformly in log space (``base`` is accepted and ignored, as in Ray)."""
        new = copy(self)
        new.set_sampler(_LogUniform())
        return new

    def normal(self, mean: float = 0.0, sd: float = 1.0) -> Float:
        """Sample from a normal distribution."""
        new = copy(self)
        new.set_sampler(_Normal(mean, sd))
        return new

    def quantized(self, q: float) -> Float:
        """Round samples to multiples of ``q`` (the upper bound becomes reachable)."""
        new = copy(self)
        new.set_sampler(_Quantized(new.get_sampler(), q), allow_override=True)
        return new

    def is_valid(self, value: Any) -> bool:
        return bool(self.lower <= value <= self.upper)

    @property
    def domain_str(self) -> str:
        return f"({self.lower}, {self.upper})"


class Integer(Domain):
    """An integer range ``[lower, upper)`` (quantized samplers include ``upper``)."""

    def __init__(self, lower: int, upper: int) -> None:
        self.lower = lower
        self.upper = upper

    def cast(self, value: Any) -> int:
        return int(value)

    def uniform(self) -> Integer:
        """Sample uniformly."""
        new = copy(self)
        new.set_sampler(_Uniform())
        return new

    def loguniform(self, base: object = None) -> Integer:
        """Sample uniformly in log space."""
        new = copy(self)
        new.set_sampler(_LogUniform())
        return new

    def quantized(self, q: int) -> Integer:
        """Sample multiples of ``q`` (``upper`` included unless ``q == 1``)."""
        new = copy(self)
        new.set_sampler(_Quantized(new.get_sampler(), q), allow_override=True)
        return new

    def is_valid(self, value: Any) -> bool:
        return bool(self.lower <= value <= self.upper)

    @property
    def domain_str(self) -> str:
        return f"({self.lower}, {self.upper})"


class Categorical(Domain):
    """One of a list of values."""

    def __init__(self, categories: Sequence[Any]) -> None:
        try:
            self.categories = list(categories)
            self._bad = ""
        except TypeError:
            self.categories = []
            self._bad = f"choice() needs a list of values, got {type(categories).__name__}"

    def uniform(self) -> Categorical:
        """Sample uniformly."""
        new = copy(self)
        new.set_sampler(_Uniform())
        return new

    def grid(self) -> Categorical:
        """Expand into one trial per category."""
        new = copy(self)
        new.set_sampler(_Grid())
        return new

    def problems(self) -> list[str]:
        if self._bad:
            return [self._bad]
        if not self.categories:
            return ["choice() needs at least one category, got an empty list"]
        return []

    def __len__(self) -> int:
        return len(self.categories)

    def __getitem__(self, item: int) -> Any:
        return self.categories[item]

    def is_valid(self, value: Any) -> bool:
        return value in self.categories

    @property
    def domain_str(self) -> str:
        return f"{self.categories}"


class Function(Domain):
    """``sample_from(fn)``: a value computed by ``fn(config)`` (or ``fn()``)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.pass_config = True
        self._bad = ""
        if not callable(func):
            self._bad = f"sample_from() needs a function, got {type(func).__name__}"
            return
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):
            return
        try:
            sig.bind({})
        except TypeError:
            self.pass_config = False
            try:
                sig.bind()
            except TypeError:
                self._bad = "the function given to sample_from() must take 0 or 1 arguments"

    def problems(self) -> list[str]:
        return [self._bad] if self._bad else []

    def is_function(self) -> bool:
        return True

    def call(self, config: dict[str, Any]) -> Any:
        """Evaluate the function on the (partly resolved) config."""
        if not self.pass_config:
            return self.func()
        try:
            return self.func(config)
        except (AttributeError, KeyError):
            # Old style: fn(spec) reading spec.config.x
            return self.func(_AttrDict({"config": _AttrDict.wrap(config)}))

    def sample(
        self, config: dict[str, Any] | None = None, size: int = 1, random_state: Any = None
    ) -> Any:
        items = [self.call(config or {}) for _ in range(size)]
        return items if size > 1 else items[0]

    def is_valid(self, value: Any) -> bool:
        return True

    @property
    def domain_str(self) -> str:
        return f"{getattr(self.func, '__name__', self.func)}()"


class _AttrDict(dict):  # type: ignore[type-arg]
    """A dict whose keys can also be read as attributes (``spec.config.lr``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def wrap(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return cls({k: cls.wrap(v) for k, v in value.items()})
        return value


def sample_from(func: Callable[..., Any]) -> Function:
    """A value computed by ``func(config)`` from the rest of the trial's config."""
    return Function(func)


def uniform(lower: float, upper: float) -> Float:
    """A float drawn uniformly from ``[lower, upper]``."""
    return Float(lower, upper).uniform()


def quniform(lower: float, upper: float, q: float) -> Float:
    """A float drawn uniformly and rounded to a multiple of ``q`` (upper bound included)."""
    return Float(lower, upper).uniform().quantized(q)


def loguniform(lower: float, upper: float, base: object = None) -> Float:
    """A float drawn uniformly in log space between ``lower`` > 0 and ``upper``."""
    return Float(lower, upper).loguniform()


def qloguniform(lower: float, upper: float, q: float, base: object = None) -> Float:
    """A log-uniform float rounded to a multiple of ``q``."""
    return Float(lower, upper).loguniform().quantized(q)


def choice(categories: Sequence[Any]) -> Categorical:
    """One of ``categories``, drawn uniformly."""
    return Categorical(categories).uniform()


def randint(lower: int, upper: int) -> Integer:
    """An integer in ``[lower, upper)`` (upper excluded)."""
    return Integer(lower, upper).uniform()


def lograndint(lower: int, upper: int, base: object = None) -> Integer:
    """An integer in ``[lower, upper)``, drawn uniformly in log space."""
    return Integer(lower, upper).loguniform()


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """A multiple of ``q`` in ``[lower, upper]`` (upper included, except for ``q == 1``)."""
    return Integer(lower, upper).uniform().quantized(q)


def qlograndint(lower: int, upper: int, q: int, base: object = None) -> Integer:
    """A multiple of ``q`` in ``[lower, upper]``, drawn uniformly in log space."""
    return Integer(lower, upper).loguniform().quantized(q)


def randn(mean: float = 0.0, sd: float = 1.0) -> Float:
    """A float drawn from a normal distribution."""
    return Float(None, None).normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Float:
    """A normal float rounded to a multiple of ``q``."""
    return Float(None, None).normal(mean, sd).quantized(q)


def grid_search(values: Sequence[Any]) -> dict[str, list[Any]]:
    """Try every value: one trial per value (times ``num_samples``), as in Ray."""
    return {"grid_search": values}  # type: ignore[dict-item]
