"""The core client's helpers name it by the protocols in ``core/ports.py``.

Two checks, neither starting a process: each protocol lists exactly what its helper reads
of the client (read from the helper's source with ``ast``), and a real ``CoreClient``
satisfies each protocol (every member is there, a method with the protocol's parameters,
a coroutine where the protocol's is one, and the nested submitters satisfy theirs).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, get_type_hints

import pytest

from nbcluster._runtime.config import Config
from nbcluster._runtime.core import ports
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.core.ownership import Entry, OwnershipTable, Release
from nbcluster._runtime.core.records import TaskRecord
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels

CORE = Path(ports.__file__).parent
#: what the protocols' annotations name (imported there for type checking only)
NAMES = {
    **vars(ports),
    "Config": Config,
    "Channels": Channels,
    "AuthedStub": AuthedStub,
    "OwnershipTable": OwnershipTable,
    "Entry": Entry,
    "Release": Release,
    "TaskRecord": TaskRecord,
}

#: helper module -> the protocol its client is annotated with
HELPERS = {
    "submitter": ports.SubmitterHost,
    "pending_tasks": ports.PendingHost,
    "generators": ports.GeneratorHost,
    "head_retry": ports.HeadRetryHost,
    "service": ports.ServiceHost,
    "actor_submitter": ports.ActorSubmitterHost,
    "node_watch": ports.NodeWatchHost,
    "routes": ports.RouteHost,
    "thread_tasks": ports.ThreadTasksHost,
}
#: members every object has (``generators.registry`` keeps its table in ``__dict__``)
IMPLICIT = {"__dict__"}


def members(proto: type) -> set[str]:
    """The names a protocol declares (its own, not ``Protocol``'s machinery)."""
    return {
        name
        for name in vars(proto)
        if not name.startswith("__")
        and name not in ("_is_protocol", "_is_runtime_protocol")
        and not name.startswith("_abc_")
    }


def client_reads(source: str) -> Iterator[str]:
    """Every ``client.X``, ``self.client.X`` and ``self._client.X`` in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        direct = isinstance(value, ast.Name) and value.id == "client"
        on_self = (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
            and value.attr in ("client", "_client")
        )
        if direct or on_self:
            yield node.attr


@pytest.mark.parametrize("module", sorted(HELPERS))
def test_each_protocol_lists_exactly_what_its_helper_reads(module: str) -> None:
    used = set(client_reads((CORE / f"{module}.py").read_text(encoding="utf-8"))) - IMPLICIT
    declared = members(HELPERS[module])
    assert used - declared == set(), f"{module}.py reads these, add them to the protocol"
    assert declared - used == set(), f"{module}.py no longer reads these: drop them"


def test_the_helpers_do_not_name_the_core_client() -> None:
    for module in sorted(set(HELPERS) - {"actor_submitter"}):  # the lead's file this session
        source = (CORE / f"{module}.py").read_text(encoding="utf-8")
        assert "core.client import" not in source, module


def _check(obj: Any, proto: type, where: str) -> None:
    missing = sorted(name for name in members(proto) if not hasattr(obj, name))
    assert not missing, f"{where} has no {missing} ({proto.__name__})"
    for name in sorted(members(proto)):
        declared = vars(proto)[name]
        value = getattr(obj, name)
        if isinstance(declared, property):
            want = get_type_hints(declared.fget, NAMES).get("return")
            if isinstance(want, type) and getattr(want, "_is_protocol", False):
                _check(value, want, f"{where}.{name}")
            elif isinstance(want, type) and want is not Any:
                assert isinstance(value, want), f"{where}.{name} is not a {want.__name__}"
            continue
        assert callable(value), f"{where}.{name} is not callable"
        got = list(inspect.signature(value).parameters)
        expected = list(inspect.signature(declared).parameters)[1:]  # without self
        assert got == expected, f"{where}.{name}{got} != {proto.__name__}.{name}{expected}"
        assert inspect.iscoroutinefunction(value) == inspect.iscoroutinefunction(declared), (
            f"{where}.{name}: async must match the protocol"
        )


@pytest.fixture(scope="module")
def client() -> Iterator[CoreClient]:
    c = CoreClient(
        mode="driver",
        config=Config(),
        token="t",
        head_address="127.0.0.1:1",
        node_address="127.0.0.1:2",
        job_id=b"j",
    )
    yield c
    c.loop.close()


@pytest.mark.parametrize("proto", sorted(HELPERS.values(), key=lambda p: p.__name__))
def test_the_core_client_satisfies_each_protocol(client: CoreClient, proto: type) -> None:
    _check(client, proto, "CoreClient")


def test_the_check_fails_on_a_missing_member_and_a_wrong_signature() -> None:
    class NoAddress:
        channels = head_address = config = None

    with pytest.raises(AssertionError, match=r"has no \['closed'\]"):
        _check(NoAddress(), ports.HeadRetryHost, "NoAddress")

    class BadWaits:
        def object_ready(self, entry: Any) -> None: ...

        def add_async_waiter(self, entry: Any) -> None: ...

    with pytest.raises(AssertionError, match="add_async_waiter"):
        _check(BadWaits(), ports.ObjectWaits, "BadWaits")

    class Nodes(Protocol):
        async def alive_nodes(self, max_age: float = 1.0) -> list[Any]: ...

    class SyncNodes:
        def alive_nodes(self, max_age: float = 1.0) -> list[Any]:
            return []

    with pytest.raises(AssertionError, match="async must match"):
        _check(SyncNodes(), Nodes, "SyncNodes")


def test_reads_are_found_in_every_form() -> None:
    src = (
        "def f(client):\n    client.a\n"
        "class C:\n    def g(self):\n        self.client.b\n        self._client.c\n"
        "        self.other.d\n"
    )
    assert sorted(client_reads(src)) == ["a", "b", "c"]
