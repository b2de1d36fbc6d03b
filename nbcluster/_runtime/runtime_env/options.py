"""``runtime_env`` as a task/actor option: checked when given, frozen so options hash.

The options table (``nbcluster/options.py``) calls :func:`normalize_runtime_env` for the
``runtime_env`` field of :class:`TaskOptions` and :class:`ActorOptions`; bad keys, types,
requirement strings and local paths that do not exist raise there, at ``@remote`` or
``.options()`` time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from nbcluster._runtime.runtime_env import resolve, spec

__all__ = ["FrozenRuntimeEnv", "normalize_runtime_env"]


class FrozenRuntimeEnv(Mapping[str, Any]):
    """A validated, read-only ``runtime_env`` (hashable by its canonical JSON)."""

    __slots__ = ("_data", "_key")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self._key = spec.to_json(self._data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenRuntimeEnv):
            return self._key == other._key
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    @property
    def key(self) -> str:
        """The canonical JSON of the environment (what the submission cache is keyed by)."""
        return self._key

    def __repr__(self) -> str:
        return repr(self._data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenRuntimeEnv, (self._data,))


def normalize_runtime_env(value: object) -> FrozenRuntimeEnv | None:
    """Check a ``runtime_env`` option; None (or empty) stays None."""
    if value is None or isinstance(value, FrozenRuntimeEnv):
        return value or None
    env = spec.validate(value)
    resolve.check_local_paths(env)
    return FrozenRuntimeEnv(env) if env else None
