"""The head never unpickles user bytes (RELIABILITY S08 and posture item 5; issue 12, item 7).

A pickle that would create a file when loaded is sent straight to the head (raw gRPC with
the cluster token) as a function payload and a KV value. The head stores it and hands it
back byte for byte, also after a restart that reads it back from SQLite, and the file
never appears. Workers unpickle user code; the control plane must not.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import grpc
import pytest

import nbcluster
from nbcluster._runtime import proc
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster.state import local_cluster
from nbcluster.testing import poll_for

HEAD_PACKAGE = Path(nbcluster.__file__).resolve().parent / "_runtime" / "head"


class _Hostile:
    """Loading this pickle calls ``open(marker, "w")``: the file is the proof of a load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _head(address: str, token: str) -> tuple[grpc.Channel, pb_grpc.HeadStub, tuple]:
    assert address.startswith("127.0.0.1:")
    channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
    return channel, pb_grpc.HeadStub(channel), (("authorization", f"Bearer {token}"),)


def test_a_hostile_pickle_sent_to_the_head_is_stored_as_opaque_bytes(
    cluster, tmp_path: Path
) -> None:
    info = cluster(num_cpus=1)
    marker = tmp_path / "unpickled-by-the-head"
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Hostile(probe)))  # such a pickle does act when loaded...
    assert probe.exists()
    payload = pickle.dumps(_Hostile(marker))  # ...so this marker appears only if it is loaded
    token = proc.read_token(Path(info.session_dir) / proc.TOKEN_FILE)
    fid = b"\xee" * 20
    channel, head, md = _head(info.address, token)
    try:
        head.ExportFunction(
            pb.ExportFunctionRequest(function_id=fid, name="evil", payload=payload),
            metadata=md,
            timeout=10,
        )
        head.KVPut(
            pb.KVRequest(ns="evil", key=b"k", value=payload, overwrite=True),
            metadata=md,
            timeout=10,
        )
        assert head.GetFunction(pb.GetFunctionRequest(function_id=fid), metadata=md).payload == (
            payload
        )
        assert head.KVGet(pb.KVRequest(ns="evil", key=b"k"), metadata=md).value == payload
    finally:
        channel.close()
    local_cluster().restart_head()  # recovery reads both back from SQLite
    channel, head, md = _head(info.address, token)
    try:
        got = poll_for(
            lambda: _get_function(head, md, fid), timeout=30, message="the head did not come back"
        )
        assert got == payload
        assert head.KVGet(pb.KVRequest(ns="evil", key=b"k"), metadata=md).value == payload
    finally:
        channel.close()
    assert not marker.exists(), "the head unpickled user bytes"


def _get_function(head: pb_grpc.HeadStub, md: tuple, fid: bytes) -> bytes | None:
    try:
        reply = head.GetFunction(pb.GetFunctionRequest(function_id=fid), metadata=md, timeout=5)
    except grpc.RpcError:
        return None
    return reply.payload if reply.found else None


@pytest.mark.parametrize("path", sorted(HEAD_PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_head_module_loads_pickles(path: Path) -> None:
    """Static backstop: the head imports no pickle loader at all."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            module = getattr(node, "module", None) or ""
            assert not {"pickle", "cloudpickle", "dill"} & {module, *names}, (
                f"{path.name} imports a pickle module"
            )
        if isinstance(node, ast.Attribute) and node.attr in ("loads", "load", "Unpickler"):
            owner = node.value
            assert not (isinstance(owner, ast.Name) and "pickle" in owner.id), (
                f"{path.name}:{node.lineno} calls {owner.id}.{node.attr}"
            )
