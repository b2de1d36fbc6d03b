"""``LazyStub``: a generated gRPC stub whose methods are registered on first use (no processes).

A generated stub's constructor registers every method of its service on the channel (28
for the head), which was most of a new worker's start-up CPU after its imports.
"""

from __future__ import annotations

from typing import Any

import pytest

from nbcluster._runtime.protocol.rpc import LazyStub, pb, pb_grpc


class FakeChannel:
    """Records each method registered on it."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, kind: str) -> Any:
        def register(path: str, **kwargs: Any) -> tuple[str, str]:
            self.registered.append((kind, path, kwargs))
            return (kind, path)

        return register


def test_a_new_lazy_stub_registers_nothing_and_each_method_once_on_first_use() -> None:
    channel = FakeChannel()
    stub = LazyStub(pb_grpc.HeadStub, channel)
    assert channel.registered == []
    method = stub.GetNodes
    assert method == ("unary_unary", "/nbcluster.Head/GetNodes")
    assert stub.GetNodes is method  # cached: registered once
    assert len(channel.registered) == 1
    kwargs = channel.registered[0][2]
    assert kwargs["request_serializer"] == pb.GetNodesRequest.SerializeToString
    assert kwargs["response_deserializer"] == pb.GetNodesReply.FromString


def test_a_lazy_stub_offers_what_the_generated_stub_registers() -> None:
    eager = FakeChannel()
    pb_grpc.CoreWorkerStub(eager)
    lazy = FakeChannel()
    stub = LazyStub(pb_grpc.CoreWorkerStub, lazy)
    names = [path.rsplit("/", 1)[1] for _kind, path, _kw in eager.registered]
    assert len(names) > 1
    for name in names:
        getattr(stub, name)
    assert lazy.registered == eager.registered  # same kinds, paths and (de)serializers


def test_an_unknown_method_is_an_attribute_error() -> None:
    stub = LazyStub(pb_grpc.NodeManagerStub, FakeChannel())
    with pytest.raises(AttributeError, match="NoSuchMethod"):
        stub.NoSuchMethod  # noqa: B018
