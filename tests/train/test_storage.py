"""What a run writes is never read half-done, and each execution keeps its own session.

No cluster: the ranks' side of ``report`` (``_persist`` into the attempt's staging
directory), the driver's side (``RunDir.commit_checkpoint``), the atomic file helpers,
and the session slots.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from nbcluster.train import Checkpoint
from nbcluster.train._fileio import TMP_PREFIX, atomic_write_bytes
from nbcluster.train._session import SessionSlot, _persist
from nbcluster.train._storage import RunDir, staging_name


def _rank_checkpoint(root, rank: int, epoch: int):
    src = root / f"rank{rank}"
    src.mkdir()
    (src / "model.pt").write_bytes(bytes([rank]) * 200_000)
    (src / f"shard{rank}.pt").write_bytes(b"x" * 1000)
    ckpt = Checkpoint.from_directory(src)
    ckpt.set_metadata({"epoch": epoch, f"rank{rank}": True, "pad": "p" * 4000})
    return ckpt


def test_a_failed_write_leaves_the_old_file_whole_and_no_litter(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    atomic_write_bytes(str(path), b'{"v": 1}')

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(str(path), b'{"v": 2, "long": "' + b"x" * 10_000 + b'"}')
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["state.json"]


def test_every_checkpoint_file_comes_into_place_by_a_rename(tmp_path, monkeypatch):
    # A file that is renamed into place is never seen half-written by another rank's merge
    # or by a loop resuming from it (the metadata of a checkpoint was once read while
    # another rank's plain copy of it was still empty: JSONDecodeError).
    src = _rank_checkpoint(tmp_path, 0, epoch=2)
    (tmp_path / "rank0" / "sub").mkdir()
    (tmp_path / "rank0" / "sub" / "opt.pt").write_bytes(b"o" * 10)
    renamed: list[str] = []
    real_replace = os.replace

    def replace(src_path, dst_path):
        renamed.append(os.path.relpath(dst_path, tmp_path / "stage"))
        real_replace(src_path, dst_path)

    monkeypatch.setattr(os, "replace", replace)
    _persist(src, str(tmp_path / "final"), str(tmp_path / "stage"))
    _persist(src, str(tmp_path / "final"), str(tmp_path / "stage"))  # a second rank merges
    files = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path / "stage")
        for d, _, fs in os.walk(tmp_path / "stage")
        for f in fs
    )
    assert files == [".metadata.json", "model.pt", "shard0.pt", os.path.join("sub", "opt.pt")]
    assert sorted(set(renamed)) == files


def test_ranks_persisting_into_one_checkpoint_at_once_merge_whole_files(tmp_path):
    # Both ranks copy into the same staging directory at the same moment, many times: no
    # rank may read the other's half-written metadata (the race that failed a run with
    # JSONDecodeError), and the merged checkpoint has every rank's files and metadata.
    sources = [_rank_checkpoint(tmp_path, r, epoch=1) for r in (0, 1)]
    rounds = 40
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        for i in range(rounds):
            barrier.wait(timeout=30)
            try:
                _persist(
                    sources[r], str(tmp_path / f"final{i}"), str(tmp_path / "run" / f"stage{i}")
                )
            except BaseException as err:  # noqa: BLE001 - collected for the assert
                errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    for i in range(rounds):
        stage = tmp_path / "run" / f"stage{i}"
        meta = Checkpoint(stage).get_metadata()
        assert meta["epoch"] == 1 and meta["rank0"] and meta["rank1"]
        assert sorted(os.listdir(stage)) == [".metadata.json", "model.pt", "shard0.pt", "shard1.pt"]
        assert (stage / "model.pt").read_bytes() in (b"\0" * 200_000, b"\1" * 200_000)


def test_a_checkpoint_appears_whole_when_the_driver_commits_it(tmp_path):
    run = RunDir(str(tmp_path), "exp")
    run.create()
    src = _rank_checkpoint(tmp_path, 0, epoch=3)
    final = run.checkpoint_path("checkpoint_000003")
    staging = os.path.join(run.path, staging_name("t1-1", "checkpoint_000003"))
    _persist(src, final, staging)
    assert not os.path.exists(final)  # not registered yet: not visible
    run.commit_checkpoint("checkpoint_000003", "t1-1")
    assert Checkpoint(final).get_metadata()["epoch"] == 3
    assert sorted(os.listdir(run.path)) == ["checkpoint_000003"]
    # A loop that reuses a directory name: the new checkpoint replaces the old one whole.
    again = tmp_path / "again"
    again.mkdir()
    Checkpoint(again).set_metadata({"epoch": 4})
    _persist(Checkpoint(again), final, os.path.join(run.path, staging_name("t1-1", "x")))
    run.commit_checkpoint("x", "t1-1")
    _persist(
        Checkpoint(again),
        final,
        os.path.join(run.path, staging_name("t1-2", "checkpoint_000003")),
    )
    run.commit_checkpoint("checkpoint_000003", "t1-2")
    assert os.listdir(final) == [".metadata.json"]
    assert Checkpoint(final).get_metadata() == {"epoch": 4}


def test_what_killed_writers_left_is_removed_and_never_registered(tmp_path):
    run = RunDir(str(tmp_path), "exp")
    run.create()
    os.makedirs(os.path.join(run.path, staging_name("t1-1", "checkpoint_000002"), "sub"))
    os.makedirs(run.checkpoint_path("checkpoint_000001"))
    (tmp_path / "exp" / f"{TMP_PREFIX}train_state.json.123.abcd").write_text("{")
    assert run.remove_unregistered({"checkpoint_000001"}) == []
    assert os.listdir(run.path) == ["checkpoint_000001"]
    run.commit_checkpoint("checkpoint_000002", "t1-1")  # its staging is gone: nothing
    assert os.listdir(run.path) == ["checkpoint_000001"]


def test_an_execution_that_ends_keeps_its_hands_off_the_next_ones_session():
    slot: SessionSlot[str] = SessionSlot("test_slot")
    seen: dict[str, object] = {}
    second_in = threading.Event()
    first_out = threading.Event()

    def first() -> None:
        with slot.use("first"):
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        with slot.use("second"):
            second_in.set()
            first_out.wait(10)
            seen["second"] = slot.get()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"second": "second"}
    assert slot.get() is None  # both ended: nothing left behind


def test_threads_an_execution_starts_find_its_session():
    slot: SessionSlot[str] = SessionSlot("test_slot")
    got: list[object] = []
    with slot.use("trial"):
        t = threading.Thread(target=lambda: got.append(slot.get()))
        t.start()
        t.join(10)
    assert got == ["trial"]
    assert slot.get() is None
