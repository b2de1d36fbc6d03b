"""The running mark (running_mark.py): what a worker began last, read after it died."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from nbcluster._runtime.running_mark import RunningMark, encode, mark_dir, mark_path, read_mark


def test_a_mark_outlives_a_killed_process_and_is_read_once(tmp_path: Path) -> None:
    mark_dir(tmp_path).mkdir()
    path = mark_path(tmp_path, b"\x01" * 8)
    pid = os.fork()
    if pid == 0:  # the worker: two tasks begun, then killed while running the second
        try:
            mark = RunningMark(path)
            mark.set(b"a" * 16, 0)
            mark.set(b"b" * 16, 3)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert read_mark(path) == encode(b"b" * 16, 3)
    assert not path.exists()  # removed by its reader
    assert read_mark(path) == b""


def test_no_mark_a_torn_mark_or_no_session_directory_reads_as_unknown(tmp_path: Path) -> None:
    assert read_mark(tmp_path / "missing") == b""
    torn = tmp_path / "torn"
    torn.write_bytes(bytes(64))  # length byte 0: died between the writes
    assert read_mark(torn) == b""
    assert RunningMark.open("", b"\x02") is None
    assert RunningMark.open(str(tmp_path / "nowhere"), b"\x02") is None  # no running/ dir
    mark_dir(tmp_path).mkdir()
    mark = RunningMark.open(str(tmp_path), b"\x02")
    assert mark is not None
    mark.set(b"c" * 200, 0)  # too long for the file: left as it was (unknown)
    mark.close()
    assert read_mark(mark_path(tmp_path, b"\x02")) == b""
    assert encode(b"t", 1) != encode(b"t", 2)
