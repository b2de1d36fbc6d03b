"""Every tunable of nbcluster, in one frozen dataclass.

Nothing is read at import. :meth:`Config.from_env` reads ``NBCLUSTER_<FIELD>`` environment
variables (for example ``NBCLUSTER_HEARTBEAT_INTERVAL_S=0.1``) when ``init()`` or
``LocalCluster()`` runs, then applies keyword overrides. :meth:`Config.to_env` turns the
values that differ from the defaults back into variables, so a child process started with
them sees the same configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["ENV_PREFIX", "Config"]

#: Prefix of the environment variables that :meth:`Config.from_env` reads.
ENV_PREFIX = "NBCLUSTER_"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NONE = frozenset({"", "none", "null"})
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Config:
    """The tunables of one cluster or driver. Build it with :meth:`from_env`."""

    max_inline_bytes: int = 100 * 1024
    """Values smaller than this travel inside RPC messages; larger ones go to the store."""
    heartbeat_interval_s: float = 0.5
    """How often, at most, a node manager reports changes to the head (every interval while
    lease requests wait; an idle node only sends a keep-alive every node_death_timeout_s/4)."""
    node_death_timeout_s: float = 30.0
    """A node that has sent no heartbeat for this long is declared dead."""
    lease_idle_timeout_s: float = 0.5
    """A worker lease with no task for this long is returned to its node."""
    max_tasks_in_flight_per_worker: int = 32
    """Tasks pushed to one leased worker before waiting for replies (pipelining depth)."""
    task_channels: bool = True
    """Send tasks and actor calls to workers on raw-socket task channels (False: on gRPC
    streams, as before; ``NBCLUSTER_TASK_CHANNELS=0``)."""
    task_channel_local: bool = True
    """On one host, task channels go over an abstract Unix socket instead of TCP (without
    TLS; ``core/channel.py``, "Same host"; ``NBCLUSTER_TASK_CHANNEL_LOCAL=0``: TCP only)."""
    actor_thread_reads: bool = True
    """A thread waiting in ``get`` for an actor call it sent reads the reply off the actor's
    channel itself, while no other call to that actor is out (``core/actor_submitter.py``,
    "Thread reads"; False: the I/O loop reads every reply; ``NBCLUSTER_ACTOR_THREAD_READS=0``)."""
    task_thread_io: bool = True
    """A thread that submits a task with no argument to wait for, while a lease of its shape
    waits idle, writes it to the worker itself, and a thread waiting in ``get`` for it reads
    the reply itself (``core/thread_tasks.py``; False: both go through the I/O loop;
    ``NBCLUSTER_TASK_THREAD_IO=0``)."""
    loop_spin: bool = True
    """After the I/O loop writes a lone task of a function known to run in well under a
    millisecond, it polls briefly for the reply instead of sleeping, and the worker polls
    briefly for the next such task (``core/thread_reads.py``, ``LoopSpin``; a chain of
    dependent tasks then wakes neither side; stops by itself while polls mostly miss;
    ``NBCLUSTER_LOOP_SPIN=0``: never)."""
    direct_tasks: bool = True
    """A worker's main thread reads its task leases' channels and runs each task where it
    reads it, as a plain sync actor's does (``worker/direct.py``; False: the I/O loop reads
    them and queues the tasks; ``NBCLUSTER_DIRECT_TASKS=0``)."""
    worker_grpc_idle_s: float = 2.0
    """A worker with no gRPC call in flight and no task running for this long closes its
    gRPC server and channels until they are needed, so that gRPC's threads stop waking it
    (``core/dormancy.py``; 0 keeps them open)."""
    control_channels: bool = True
    """Placement-group calls (driver to head, head to node managers) on raw-socket control
    channels (``protocol/ctrl.py``; False: on gRPC, as before; ``NBCLUSTER_CONTROL_CHANNELS=0``)."""
    object_store_memory: int | None = None
    """Bytes of shared memory for each node's object store; None picks from free memory."""
    store_base_dir: str = "/dev/shm"
    """Where the shared-memory store lives; a file-backed store is used if it is too small."""
    spill_dir: str | None = None
    """Where objects spill to disk; None means a folder under ``temp_dir``."""
    spilling_enabled: bool = True
    """Spill referenced objects to disk when the store is full, instead of failing."""
    temp_dir: str = "/tmp/nbcluster"
    """Root of the session directories (logs, sockets, the token file)."""
    function_size_warn_bytes: int = 10 * 2**20
    """Warn when a pickled function or class is larger than this (closures over data)."""
    function_size_error_bytes: int = 100 * 2**20
    """Refuse, at submit time, a pickled function or class larger than this."""
    infeasible_warning_s: float = 2.0
    """Warn when a task or actor has waited this long for resources no node has."""
    head_grace_period_s: float = 30.0
    """Keep retrying an unreachable head this long before ``HeadUnavailableError``."""
    rpc_max_message_bytes: int = 512 * 2**20
    """Largest gRPC message, sent or received."""
    worker_prestart: int | None = None
    """Warm workers each node starts ahead of demand; None means one per CPU."""
    log_level: str = "WARNING"
    """Level of nbcluster's own loggers: DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    task_events_capacity: int = 100_000
    """Task events the head keeps for the timeline (a ring; the oldest are dropped)."""
    memory_usage_threshold: float = 0.95
    """The node's memory monitor kills the newest retriable task above this fraction of RAM."""
    memory_monitor_interval_s: float = 0.25
    """How often the memory monitor checks (0 turns it off)."""
    task_oom_retries: int = 3
    """Retries of a task killed by the memory monitor (separate from max_retries; -1: forever)."""
    max_pending_tasks: int = 0
    """The most tasks (not actor calls) one driver or worker may have submitted and not yet
    finished; one more raises ``PendingTasksLimitExceeded`` at ``.remote()`` (0: no limit)."""
    autoscale_max_nodes: int = 0
    """A local cluster started by ``init()`` grows to this many nodes under load (0: fixed size)."""
    autoscale_idle_timeout_s: float = 60.0
    """Seconds an autoscaled local node stays idle before it is removed."""

    # Fields that must be > 0 (all other numbers must be >= 0).
    _POSITIVE: ClassVar[frozenset[str]] = frozenset(
        {
            "heartbeat_interval_s",
            "node_death_timeout_s",
            "max_tasks_in_flight_per_worker",
            "object_store_memory",
            "function_size_warn_bytes",
            "function_size_error_bytes",
            "rpc_max_message_bytes",
            "task_events_capacity",
        }
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            base, optional = _field_type(f.name)
            if value is None:
                if not optional:
                    raise TypeError(f"{_label(f.name)} cannot be None")
                continue
            if base is float and _is_int(value):
                value = float(value)
                object.__setattr__(self, f.name, value)
            if not isinstance(value, base) or (base is not bool and isinstance(value, bool)):
                raise TypeError(
                    f"{_label(f.name)} must be {_type_name(base, optional)}, "
                    f"got {value!r} ({type(value).__name__})"
                )
            if base in (int, float):
                if base is float and not math.isfinite(value):
                    raise ValueError(f"{_label(f.name)} must be a finite number, got {value!r}")
                if f.name in self._POSITIVE and value <= 0:
                    raise ValueError(f"{_label(f.name)} must be > 0, got {value!r}")
                if value < 0:
                    raise ValueError(f"{_label(f.name)} must be >= 0, got {value!r}")
        level = self.log_level.upper()
        if level not in _LOG_LEVELS:
            raise ValueError(
                f"{_label('log_level')} must be one of {', '.join(_LOG_LEVELS)}, "
                f"got {self.log_level!r}"
            )
        object.__setattr__(self, "log_level", level)
        if self.function_size_warn_bytes > self.function_size_error_bytes:
            raise ValueError(
                f"{_label('function_size_warn_bytes')} must not exceed function_size_error_bytes "
                f"({self.function_size_warn_bytes} > {self.function_size_error_bytes})"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, /, **overrides: Any) -> Config:
        """Read ``NBCLUSTER_<FIELD>`` variables from ``environ`` (default ``os.environ``).

        Keyword ``overrides`` win over the environment. Values are parsed by the field's
        type: ints and floats as numbers, bools as 1/true/yes/on or 0/false/no/off, optional
        fields as None when empty or ``none``. Unknown ``NBCLUSTER_*`` variables are ignored
        (other parts of nbcluster, such as the token, use the same prefix).
        """
        names = cls.field_names()
        unknown = sorted(set(overrides) - names)
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"Unknown config option {unknown[0]!r}. Valid options: "
                f"{', '.join(sorted(names))}.{hint}"
            )
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in sorted(names):
            var = cls.env_var(name)
            if var in env:
                values[name] = _parse(name, var, env[var])
        values.update(overrides)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The values that differ from the defaults, as ``NBCLUSTER_<FIELD>`` variables."""
        default = type(self)()
        env: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                env[self.env_var(f.name)] = _format(value)
        return env

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """The names of all tunables."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @staticmethod
    def env_var(name: str) -> str:
        """The environment variable for field ``name``: ``NBCLUSTER_<NAME>``."""
        return ENV_PREFIX + name.upper()

    def logging_level(self) -> int:
        """``log_level`` as a :mod:`logging` level number."""
        return logging.getLevelName(self.log_level)  # type: ignore[no-any-return]


def _label(name: str) -> str:
    return f"Config.{name} ({Config.env_var(name)})"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field_type(name: str) -> tuple[type, bool]:
    """(base type, optional) of a Config field, from its annotation."""
    hint = _type_hints()[name]
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        non_none = [a for a in args if a is not type(None)]
        assert len(non_none) == 1, f"unsupported annotation for Config.{name}: {hint}"
        return non_none[0], True
    return hint, False


def _type_name(base: type, optional: bool) -> str:
    names = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}
    return names[base] + (" or None" if optional else "")


def _parse(name: str, var: str, raw: str) -> Any:
    base, optional = _field_type(name)
    text = raw.strip()
    if optional and text.lower() in _NONE:
        return None
    try:
        if base is bool:
            lowered = text.lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        return raw
    except ValueError:
        expected = {
            bool: "1/true/yes/on or 0/false/no/off",
            int: "an integer",
            float: "a number",
        }[base]
        if optional:
            expected += " (or empty for the default)"
        raise ValueError(f"{var} must be {expected}, got {raw!r}") from None


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@functools.cache
def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(Config)
