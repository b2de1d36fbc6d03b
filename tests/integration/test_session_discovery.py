"""Session discovery across users (issue 12, item 7; RELIABILITY default-safe posture).

``address="auto"``, ``%cluster connect auto``, ``nbcluster start --address`` and
``nbcluster stop`` find local clusters through session directories. In a root shared by
several users those must be this user's own directories, that nobody else can write, with a
head PID this user can signal. A second user is a forked child that calls ``os.setuid``
(the interpreter lives under /root here, so ``runuser`` cannot start it as another user).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nbcluster import cli
from nbcluster._runtime import proc
from nbcluster.cluster import find_session, own_sessions, signallable

NOBODY = 65534

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="making files of another user (chown, setuid) needs root"
)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A root like /tmp/nbcluster: world-writable and sticky, reachable by every user."""
    root = Path(tempfile.mkdtemp(prefix="nbc-shared-", dir="/tmp"))
    os.chmod(root, 0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _fake_head(session: Path, pid: int, address: str) -> Path:
    (session / "head.pid").write_text(str(pid))
    (session / proc.HEAD_ADDRESS_FILE).write_text(address + "\n")
    return session


def _as_user(uid: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child that became ``uid``; return its (JSON) result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no exceptions escaping
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = {"ok": fn()}
        except BaseException:  # noqa: BLE001 - reported to the parent
            out = {"error": traceback.format_exc()}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    result = json.loads(data)
    assert "error" not in result, result["error"]
    return result["ok"]


def test_sessions_others_can_write_or_that_are_links_are_ignored(shared_root: Path) -> None:
    mine = _fake_head(proc.new_session_dir(str(shared_root)), os.getpid(), "127.0.0.1:1111")
    writable = _fake_head(proc.new_session_dir(str(shared_root)), os.getpid(), "127.0.0.1:2222")
    os.chmod(writable, 0o777)  # newer, but anyone could have put a head.addr in it
    (shared_root / "session_zz_link").symlink_to(mine)
    assert find_session("auto", str(shared_root)) == mine
    assert find_session("127.0.0.1:2222", str(shared_root)) is None
    assert own_sessions(str(shared_root)) == [mine]


@needs_root
def test_sessions_of_another_user_are_ignored(shared_root: Path) -> None:
    mine = _fake_head(proc.new_session_dir(str(shared_root)), os.getpid(), "127.0.0.1:1111")
    theirs = _fake_head(proc.new_session_dir(str(shared_root)), os.getpid(), "127.0.0.1:3333")
    os.chown(theirs, NOBODY, NOBODY)  # newer; its head PID is alive and signallable by us
    assert find_session("auto", str(shared_root)) == mine
    assert find_session("127.0.0.1:3333", str(shared_root)) is None


@needs_root
def test_a_head_pid_the_user_cannot_signal_is_not_alive(shared_root: Path) -> None:
    root_pid = os.getpid()  # alive, but another user's process for the child

    def child() -> list[Any]:
        session = proc.new_session_dir(str(shared_root))
        _fake_head(session, root_pid, "127.0.0.1:4444")  # a reused PID: root's process
        before = find_session("auto", str(shared_root))
        _fake_head(session, os.getpid(), "127.0.0.1:4444")  # a head this user really runs
        after = find_session("auto", str(shared_root))
        return [signallable(root_pid), str(before), str(after), str(session)]

    can_signal, before, after, session = _as_user(NOBODY, child)
    assert can_signal is False
    assert before == "None"
    assert after == session


@needs_root
def test_the_shared_root_serves_two_users_each_finding_only_their_own(shared_root: Path) -> None:
    mine = _fake_head(proc.new_session_dir(str(shared_root)), os.getpid(), "127.0.0.1:5555")
    proc.write_atomic(mine / "pids.json", json.dumps({"head": 0, "nodes": []}))

    def child() -> dict[str, Any]:
        # Before the fix, creating a session failed (root's session_latest link cannot be
        # replaced in a sticky root) and listing crashed on root's unreadable directories.
        session = _fake_head(proc.new_session_dir(str(shared_root)), os.getpid(), "127.0.0.1:6666")
        os.environ["NBCLUSTER_TEMP_DIR"] = str(shared_root)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.cmd_stop(argparse.Namespace())
        return {
            "session": str(session),
            "auto": str(find_session("auto", str(shared_root))),
            "root_by_address": str(find_session("127.0.0.1:5555", str(shared_root))),
            "own": [str(p) for p in own_sessions(str(shared_root))],
            "stop": [code, out.getvalue()],
        }

    seen = _as_user(NOBODY, child)
    assert seen["auto"] == seen["session"]
    assert seen["root_by_address"] == "None"
    assert seen["own"] == [seen["session"]]
    assert seen["stop"] == [0, "nbcluster stop: signalled 0 process(es)\n"]
    assert (mine / "pids.json").exists()  # the other user's stop left this session alone
    # Each user keeps their own "latest" link; root still finds only its own session.
    assert os.readlink(shared_root / f"session_latest_{os.geteuid()}") == mine.name
    assert os.readlink(shared_root / f"session_latest_{NOBODY}") == Path(seen["session"]).name
    assert find_session("auto", str(shared_root)) == mine
