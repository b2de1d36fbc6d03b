"""``init("nbcluster://...", runtime_env=...)``: client mode runs its work in the env (issue 17).

As in Ray Client, the environment is resolved on the client: a ``working_dir`` given as a
path relative to the client's current directory (which the proxy driver on the head's
host could not resolve) is packed and uploaded from here, and every task and actor of the
client runs in it; a call's own ``runtime_env`` is merged with it by Ray's rules.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import LocalCluster

pytestmark = pytest.mark.integration


def _work() -> tuple[Any, Any, Any]:
    """The remote functions and class, defined here so they are pickled by value (the
    proxy driver cannot import this test module)."""

    @nbcluster.remote
    def read(name: str, *keys: str) -> tuple[str, list[str | None]]:
        with open(name) as f:
            text = f.read()
        return text, [os.environ.get(k) for k in keys]

    @nbcluster.remote
    def imported() -> int:
        import client_side_helper  # type: ignore[import-not-found]  # from the working_dir

        return int(client_side_helper.VALUE)

    @nbcluster.remote
    class Reader:
        def read(self, name: str) -> tuple[str, str | None]:
            with open(name) as f:
                return f.read(), os.environ.get("GREETING")

    return read, imported, Reader


@pytest.fixture
def client(
    job_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    wd = tmp_path / "client_wd"
    wd.mkdir()
    (wd / "data.txt").write_text("from the client")
    (wd / "client_side_helper.py").write_text("VALUE = 7\n")
    other = tmp_path / "other_wd"
    other.mkdir()
    (other / "data.txt").write_text("from the other dir")
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(
        f"nbcluster://{job_cluster.address}",
        runtime_env={"working_dir": "client_wd", "env_vars": {"GREETING": "hi"}},
    )
    try:
        yield info
    finally:
        nbcluster.shutdown()


def test_tasks_and_actors_run_in_the_clients_env(client: Any) -> None:
    read, imported, Reader = _work()
    assert nbcluster.get(read.remote("data.txt", "GREETING"), timeout=120) == (
        "from the client",
        ["hi"],
    )
    assert nbcluster.get(imported.remote(), timeout=60) == 7
    reader = Reader.remote()
    assert nbcluster.get(reader.read.remote("data.txt"), timeout=60) == ("from the client", "hi")


def test_a_calls_own_env_is_merged_with_the_clients(client: Any) -> None:
    read, _, _ = _work()
    merged = read.options(runtime_env={"env_vars": {"OTHER": "x"}})
    assert nbcluster.get(merged.remote("data.txt", "GREETING", "OTHER"), timeout=60) == (
        "from the client",
        ["hi", "x"],
    )
    # a working_dir of its own replaces the client's, and is uploaded from here too
    moved = read.options(runtime_env={"working_dir": "other_wd"})
    assert nbcluster.get(moved.remote("data.txt", "GREETING"), timeout=60) == (
        "from the other dir",
        ["hi"],
    )


def test_a_missing_working_dir_fails_at_init(job_cluster: LocalCluster, tmp_path: Path) -> None:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    with pytest.raises(ValueError, match=r"runtime_env\['working_dir'\]: .*does not exist"):
        nbcluster.init(
            f"nbcluster://{job_cluster.address}",
            runtime_env={"working_dir": str(tmp_path / "nope")},
        )
    assert not nbcluster.is_initialized()
