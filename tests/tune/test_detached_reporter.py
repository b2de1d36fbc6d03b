"""The detached controller's recording reporter and status file, without processes."""

from __future__ import annotations

import os
from typing import Any

import cloudpickle

from nbcluster.tune.execution.detached import (
    STATUS_FILE,
    RecordingReporter,
    controller_actor_name,
    read_status,
    write_status,
)
from nbcluster.tune.experiment.trial import Trial


def _trials(n: int) -> list[Trial]:
    return [Trial("train_fn", f"abc_{i:05d}", {"x": i}) for i in range(n)]


def test_snapshots_carry_the_trials_and_the_events_after_a_sequence_number() -> None:
    rep = RecordingReporter("score", "max", "/tmp/exp")
    trials = _trials(2)
    rep.start(trials)
    snap = rep.snapshot(0)
    assert [t.trial_id for t in cloudpickle.loads(snap["trials"])] == ["abc_00000", "abc_00001"]
    assert snap["events"] == [] and snap["seq"] == 0
    rep.output(trials[0], "hello\nworld")
    rep.trial_failed(trials[1], retrying=True)
    rep.note("stopping: interrupted")
    snap = rep.snapshot(0)
    assert [e[1:] for e in snap["events"]] == [
        ("output", ("abc_00000", "hello\nworld")),
        ("failed", ("abc_00001", True)),
        ("note", ("stopping: interrupted",)),
    ]
    assert snap["seq"] == 3 and snap["note"] == "stopping: interrupted"
    assert [e[1] for e in rep.snapshot(2)["events"]] == ["note"]
    assert rep.snapshot(3)["events"] == []


def test_a_snapshot_is_a_copy_taken_by_update_and_at_the_end() -> None:
    rep = RecordingReporter(None, None, "")
    trials = _trials(1)
    rep.start(trials)
    trials[0].status = Trial.RUNNING  # the controller's objects change; the snapshot does not
    assert cloudpickle.loads(rep.snapshot(0)["trials"])[0].status == Trial.PENDING
    rep.update(trials, force=True)
    assert cloudpickle.loads(rep.snapshot(0)["trials"])[0].status == Trial.RUNNING
    trials[0].status = Trial.TERMINATED
    assert not rep.finished
    rep.finish(trials)
    assert rep.finished
    assert cloudpickle.loads(rep.snapshot(0)["trials"])[0].status == Trial.TERMINATED


def test_the_event_log_is_bounded() -> None:
    rep = RecordingReporter(None, None, "")
    trial = _trials(1)[0]
    for i in range(5000):
        rep.output(trial, f"line {i}")
    events = rep.snapshot(0)["events"]
    assert len(events) == 2000 and events[-1][2] == ("abc_00000", "line 4999")


def test_status_file_round_trip_and_absence(tmp_path: Any) -> None:
    assert read_status(str(tmp_path)) is None
    write_status(str(tmp_path), state="RUNNING", actor_name=controller_actor_name("exp"))
    assert read_status(str(tmp_path)) == {"state": "RUNNING", "actor_name": "tune-controller:exp"}
    with open(os.path.join(tmp_path, STATUS_FILE), "w") as f:
        f.write("not json")
    assert read_status(str(tmp_path)) is None
