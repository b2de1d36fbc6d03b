"""Turn a ``param_space`` into concrete configs: grid expansion, sampling, ``sample_from``.

A param space is a nested structure of dicts and lists whose leaves are plain values,
:class:`~nbcluster.tune.search.sample.Domain` objects, or ``{"grid_search": [...]}``. A
*path* is the tuple of keys (and list indices) from the root to a leaf.

:func:`validate_space` checks a whole space and raises one ``ValueError`` naming the path
of the first bad parameter (``param_space['model']['lr']``), which is what ``Tuner(...)``
calls. :func:`generate_variants` yields one config per grid combination, the first grid
variable changing fastest, as Ray's ``BasicVariantGenerator`` does.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np

from nbcluster.tune.search.sample import Domain, Function

__all__ = [
    "Path",
    "assign_value",
    "count_variants",
    "flatten_dict",
    "format_path",
    "format_vars",
    "generate_variants",
    "get_value",
    "parse_space",
    "resolve_config",
    "validate_space",
]

Path = tuple[Any, ...]

#: How many passes ``sample_from`` functions get to see each other's values.
_MAX_FUNCTION_PASSES = 10


def format_path(path: Path, root: str = "param_space") -> str:
    """``('model', 'lr')`` -> ``"param_space['model']['lr']"``."""
    return root + "".join(f"[{k!r}]" for k in path)


def _is_grid(value: Any) -> bool:
    return isinstance(value, dict) and "grid_search" in value


def _children(value: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, list):
        yield from enumerate(value)


def parse_space(space: Any) -> tuple[list[tuple[Path, list[Any]]], list[tuple[Path, Domain]]]:
    """The grid variables (path, values) and the sampled domains (path, domain) of ``space``.

    Grid variables come sorted by path (so the expansion order is stable); a categorical
    domain with a grid sampler counts as a grid variable.
    """
    grid: list[tuple[Path, list[Any]]] = []
    domains: list[tuple[Path, Domain]] = []

    def walk(value: Any, path: Path) -> None:
        if _is_grid(value):
            grid.append((path, list(value["grid_search"])))
        elif isinstance(value, Domain):
            if value.is_grid():
                grid.append((path, list(value.categories)))  # type: ignore[attr-defined]
            else:
                domains.append((path, value))
        else:
            for key, child in _children(value):
                walk(child, (*path, key))

    walk(space, ())
    grid.sort(key=lambda item: tuple(str(k) for k in item[0]))
    return grid, domains


def validate_space(space: Any, root: str = "param_space") -> None:
    """Raise ``ValueError`` naming the first invalid parameter of ``space``."""
    if space is None:
        return
    if not isinstance(space, dict):
        raise TypeError(
            f"{root} must be a dict of parameter names to values or search spaces, got {type(space).__name__}"
        )

    def walk(value: Any, path: Path) -> None:
        where = format_path(path, root)
        if _is_grid(value):
            if len(value) != 1:
                extra = sorted(str(k) for k in value if k != "grid_search")
                raise ValueError(
                    f"Invalid search space at {where}: a grid_search dict must have no other keys "
                    f"(found {extra}); use tune.grid_search([...]) as the value"
                )
            values = value["grid_search"]
            if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
                raise ValueError(
                    f"Invalid search space at {where}: grid_search needs a list of values, "
                    f"got {type(values).__name__}"
                )
            if len(list(values)) == 0:
                raise ValueError(
                    f"Invalid search space at {where}: grid_search needs at least one value, "
                    "got an empty list"
                )
            return
        if isinstance(value, Domain):
            problems = value.problems()
            if problems:
                raise ValueError(f"Invalid search space at {where}: {value!r}: {problems[0]}")
            return
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, (str, int)):
                    raise ValueError(
                        f"Invalid search space at {where}: keys must be strings, got {key!r}"
                    )
        for key, child in _children(value):
            walk(child, (*path, key))

    walk(space, ())


def count_variants(space: Any) -> int:
    """How many configs one sample of ``space`` expands to (the product of the grids)."""
    grid, _ = parse_space(space)
    n = 1
    for _, values in grid:
        n *= len(values)
    return n


def get_value(spec: Any, path: Path) -> Any:
    """The value at ``path`` in a nested dict/list."""
    for key in path:
        spec = spec[key]
    return spec


def assign_value(spec: Any, path: Path, value: Any) -> None:
    """Set the value at ``path`` in a nested dict/list."""
    for key in path[:-1]:
        spec = spec[key]
    spec[path[-1]] = value


def _grid_combinations(grid: list[tuple[Path, list[Any]]]) -> Iterator[list[Any]]:
    """Each combination of grid values, the first variable changing fastest."""
    if not grid:
        yield []
        return
    sizes = [len(values) for _, values in grid]
    index = [0] * len(grid)
    while True:
        yield [values[i] for (_, values), i in zip(grid, index, strict=True)]
        k = 0
        while k < len(index):
            index[k] += 1
            if index[k] < sizes[k]:
                break
            index[k] = 0
            k += 1
        if k == len(index):
            return


def resolve_config(
    spec: Any, domains: list[tuple[Path, Domain]], g: np.random.Generator
) -> dict[Path, Any]:
    """Sample every domain of ``spec`` in place; return ``{path: value}`` of what was drawn.

    Plain domains are drawn first; ``sample_from`` functions then run on the config
    (functions that read other functions' results get a few passes).
    """
    resolved: dict[Path, Any] = {}
    functions: list[tuple[Path, Function]] = []
    for path, domain in domains:
        if isinstance(domain, Function):
            functions.append((path, domain))
            continue
        value = domain.sample(random_state=g)
        assign_value(spec, path, value)
        resolved[path] = value
    pending = functions
    last_error: Exception | None = None
    for _ in range(_MAX_FUNCTION_PASSES):
        if not pending:
            break
        still: list[tuple[Path, Function]] = []
        for path, fn in pending:
            try:
                value = fn.call(spec)
            except Exception as e:  # noqa: BLE001 - retried on the next pass, then reported
                still.append((path, fn))
                last_error = e
                continue
            if isinstance(value, Domain):
                value = value.sample(config=spec, random_state=g)
            assign_value(spec, path, value)
            resolved[path] = value
        if len(still) == len(pending):
            path = still[0][0]
            raise ValueError(
                f"sample_from at {format_path(path)} failed: {type(last_error).__name__}: "
                f"{last_error}. It may read a key that does not exist, or depend on itself."
            ) from last_error
        pending = still
    return resolved


def generate_variants(
    space: dict[str, Any], g: np.random.Generator
) -> Iterator[tuple[dict[Path, Any], dict[str, Any]]]:
    """Yield ``(resolved_vars, config)`` for every grid combination of ``space``."""
    grid, domains = parse_space(space)
    for combo in _grid_combinations(grid):
        spec = copy.deepcopy(space)
        resolved: dict[Path, Any] = {}
        for (path, _), value in zip(grid, combo, strict=True):
            assign_value(spec, path, value)
            resolved[path] = value
        # Nested search spaces inside grid values (rare) are resolved too.
        _, inner = parse_space(spec)
        resolved.update(resolve_config(spec, inner, g))
        yield resolved, spec


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 16 else text[:15] + "…"


def format_vars(resolved: dict[Path, Any]) -> str:
    """``{('model','lr'): 0.01, ('bs',): 32}`` -> ``'lr=0.01,bs=32'`` (for trial names)."""
    parts = []
    for path, value in resolved.items():
        key = str(path[-1]) if path else "?"
        parts.append(f"{key}={_short(value)}")
    return ",".join(parts)


def flatten_dict(d: dict[str, Any], prefix: str = "", delimiter: str = "/") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` -> ``{'a/b': 1}`` (a ``grid_search`` dict stays one value)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{delimiter}{key}" if prefix else str(key)
        if isinstance(value, dict) and value and not _is_grid(value):
            out.update(flatten_dict(value, name, delimiter))
        else:
            out[name] = value
    return out
