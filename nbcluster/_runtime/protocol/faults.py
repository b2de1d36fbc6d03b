"""Testing only: the RPC fault injector (RELIABILITY F13), and its record of fired faults.

It is active only when **both** variables are set in a process's environment (cluster
processes inherit them from the driver that starts them):

- ``NBCLUSTER_TESTING=1``: the explicit testing switch;
- ``NBCLUSTER_TESTING_RPC_FAILURE``: the rules, comma-separated.

A stray ``NBCLUSTER_TESTING_RPC_FAILURE`` without the switch does nothing (it is reported
once per process at WARNING). Rules:

- ``Method=req:reply``: unary ``Method`` loses its request (never reaches the servicer) or
  its reply (computed, side effect done, then lost) with these probabilities; ``*`` matches
  every unary method. Both surface as ``UNAVAILABLE``, like a network fault.
- ``Method.kind=T`` for one kind: ``request`` and ``reply`` (unary), ``cut`` and ``drop``
  (the ``PushTasks`` task stream, served by workers): ``cut`` delivers only the first
  ``k`` tasks of an incoming batch (``1 <= k <= n``) and then breaks the stream; ``drop``
  loses one outgoing batch of replies (the tasks ran) and breaks the stream.

A task stream gets no stream faults while a retried task it carried (attempt > 0, not an
actor call) has not been answered, so injected faults charge each task at most one retry: a test with
``max_retries >= 1`` can demand every result, whatever the fault rate.

``T`` is a probability (``0.25``) or ``everyN``: the N-th, 2N-th, ... event of that
method and kind in each process (deterministic, so a test can be sure faults fire).

Every fault fired is appended as a line ``Method kind`` to
``$NBCLUSTER_TESTING_FAULTS_DIR/faults-<pid>.log`` (when that variable is set) before it
takes effect, so a test reads the counts of every process with :func:`fired`, even of
processes that died of the fault.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

__all__ = [
    "FAULTS_DIR_ENV",
    "RULES_ENV",
    "TESTING_ENV",
    "FaultInjector",
    "Trigger",
    "current",
    "fired",
    "from_env",
]

log = logging.getLogger("nbcluster.faults")

TESTING_ENV = "NBCLUSTER_TESTING"
RULES_ENV = "NBCLUSTER_TESTING_RPC_FAILURE"
FAULTS_DIR_ENV = "NBCLUSTER_TESTING_FAULTS_DIR"

_UNARY_KINDS = ("request", "reply")
_KINDS = frozenset({"request", "reply", "cut", "drop"})


class Trigger:
    """When one rule fires: with a probability, or on every N-th event."""

    def __init__(self, text: str) -> None:
        text = text.strip()
        self.every = 0
        self.probability = 0.0
        if text.startswith("every"):
            self.every = int(text[5:])
            if self.every < 1:
                raise ValueError(f"fault rule {text!r}: everyN needs N >= 1")
        else:
            self.probability = float(text or 0)
            if not 0.0 <= self.probability <= 1.0:
                raise ValueError(f"fault rule {text!r}: a probability is between 0 and 1")
        self.events = 0

    def __repr__(self) -> str:
        return f"every{self.every}" if self.every else repr(self.probability)

    def hit(self, rng: random.Random) -> bool:
        """Count one event; True when the fault fires on it."""
        self.events += 1
        if self.every:
            return self.events % self.every == 0
        return self.probability > 0 and rng.random() < self.probability


def _parse(spec: str) -> dict[tuple[str, str], Trigger]:
    rules: dict[tuple[str, str], Trigger] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"{RULES_ENV}: rule {part!r} needs '=' (Method=req:reply)")
        name, _, value = part.partition("=")
        name = name.strip()
        if "." in name:
            method, _, kind = name.partition(".")
            if kind not in _KINDS:
                raise ValueError(
                    f"{RULES_ENV}: unknown fault kind {kind!r} in {part!r} "
                    f"(one of {', '.join(sorted(_KINDS))})"
                )
            rules[(method, kind)] = Trigger(value)
        else:
            req, _, rep = value.partition(":")
            rules[(name, "request")] = Trigger(req)
            rules[(name, "reply")] = Trigger(rep)
    return rules


class FaultInjector(grpc.aio.ServerInterceptor):
    """Loses requests and replies of unary methods; workers ask it about their streams.

    ``spec`` is the rule text described in this module's docstring. ``record_dir``, when
    given, receives one line per fired fault (see :func:`fired`).
    """

    def __init__(self, spec: str, seed: int | None = None, record_dir: str | None = None) -> None:
        self.rules = _parse(spec)
        self.random = random.Random(seed)
        self.record_dir = record_dir
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()

    @property
    def injected(self) -> int:
        """How many faults this injector fired."""
        return sum(self.counts.values())

    def _trigger(self, method: str, kind: str) -> Trigger | None:
        rule = self.rules.get((method, kind))
        if rule is None and kind in _UNARY_KINDS:
            rule = self.rules.get(("*", kind))
        return rule

    def has(self, method: str, kind: str) -> bool:
        """True when a rule covers this method and kind."""
        return self._trigger(method, kind) is not None

    def fire(self, method: str, kind: str) -> bool:
        """Count one event; True (and recorded) when the fault fires on it."""
        rule = self._trigger(method, kind)
        if rule is None:
            return False
        with self._lock:
            if not rule.hit(self.random):
                return False
            self.counts[(method, kind)] += 1
        self._record(method, kind)
        return True

    def pick(self, n: int) -> int:
        """How many of ``n`` tasks a cut batch delivers (1..n)."""
        with self._lock:
            return self.random.randint(1, max(1, n))

    def _record(self, method: str, kind: str) -> None:
        log.info("injected fault: %s %s", method, kind)
        if not self.record_dir:
            return
        try:
            path = Path(self.record_dir) / f"faults-{os.getpid()}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, f"{method} {kind}\n".encode())
            finally:
                os.close(fd)
        except OSError as err:  # the fault still fires; the test will see the count is short
            log.warning("could not record an injected fault in %s: %s", self.record_dir, err)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        name = handler_call_details.method.rsplit("/", 1)[-1]
        if (
            handler is None
            or handler.request_streaming
            or handler.response_streaming
            or not (self.has(name, "request") or self.has(name, "reply"))
        ):
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self.unary(name, handler.unary_unary),
            handler.request_deserializer,
            handler.response_serializer,
        )

    def unary(self, name: str, inner: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        """``inner(request, context)`` losing its request or reply as the rules for ``name``
        say (as ``UNAVAILABLE``): for gRPC servicers and control-channel methods alike (both
        contexts' ``abort`` raise)."""
        injector = self

        async def faulty(request: Any, context: Any) -> Any:
            if injector.fire(name, "request"):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "injected fault: request dropped")
            reply = await inner(request, context)
            if injector.fire(name, "reply"):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "injected fault: reply dropped")
            return reply

        return faulty


_warned = False
_current: tuple[tuple[str, str, str], FaultInjector | None] | None = None
_current_lock = threading.Lock()
_frozen = False


def from_env(environ: Mapping[str, str] | None = None) -> FaultInjector | None:
    """A new injector when the environment turns one on (see the module docstring), else None.

    A rule text without ``NBCLUSTER_TESTING=1`` is ignored and reported once at WARNING.
    """
    global _warned
    env = os.environ if environ is None else environ
    spec = env.get(RULES_ENV, "").strip()
    if not spec:
        return None
    if env.get(TESTING_ENV, "").strip() != "1":
        if not _warned:
            _warned = True
            log.warning(
                "%s is set but ignored: RPC fault injection runs only in tests, with %s=1",
                RULES_ENV,
                TESTING_ENV,
            )
        return None
    return FaultInjector(spec, record_dir=env.get(FAULTS_DIR_ENV) or None)


def freeze() -> None:
    """Read the variables once, now, and keep that injector for good: for cluster processes,
    whose variables do not change once started (a worker asks on every call it reads and
    every reply it sends; three environment reads each were 2 % of a worker's busy time)."""
    global _frozen
    current()
    _frozen = True


def current() -> FaultInjector | None:
    """This process's injector (shared by its servers and its task streams), or None.

    Rebuilt when the variables change (a test process starts clusters with different rules),
    unless :func:`freeze` was called.
    """
    global _current
    cached = _current
    if _frozen and cached is not None:
        return cached[1]
    env = os.environ
    key = (env.get(TESTING_ENV, ""), env.get(RULES_ENV, ""), env.get(FAULTS_DIR_ENV, ""))
    if cached is not None and cached[0] == key:
        return cached[1]
    with _current_lock:
        if _current is None or _current[0] != key:
            _current = (key, from_env())
        return _current[1]


def fired(directory: str | os.PathLike[str]) -> collections.Counter[tuple[str, str]]:
    """Faults fired by every process that recorded into ``directory``: (method, kind) -> n."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in Path(directory).glob("faults-*.log"):
        for line in path.read_text().splitlines():
            method, _, kind = line.partition(" ")
            if kind:
                counts[(method, kind)] += 1
    return counts
