"""The RPC fault injector (RELIABILITY F13): off without the testing switch, rules, counts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nbcluster._runtime.protocol import faults


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_warned", False)
    monkeypatch.setattr(faults, "_current", None)
    monkeypatch.setattr(faults, "_frozen", False)
    for var in (faults.TESTING_ENV, faults.RULES_ENV, faults.FAULTS_DIR_ENV):
        monkeypatch.delenv(var, raising=False)


def test_a_stray_rule_variable_does_nothing_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(faults.RULES_ENV, "*=1:1,PushTasks.cut=every1")
    with caplog.at_level(logging.WARNING, logger="nbcluster.faults"):
        assert faults.current() is None
        assert faults.from_env() is None
        assert faults.from_env({faults.RULES_ENV: "*=1:1", faults.TESTING_ENV: "true"}) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "ignored" in warnings[0].getMessage()
    assert faults.TESTING_ENV in warnings[0].getMessage()


def test_the_testing_switch_turns_it_on_and_is_re_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert faults.current() is None  # nothing set: nothing, no warning needed
    monkeypatch.setenv(faults.RULES_ENV, "CreateActor=0:0.5")
    monkeypatch.setenv(faults.TESTING_ENV, "1")
    first = faults.current()
    assert first is not None and faults.current() is first  # one per process
    assert first.has("CreateActor", "reply") and not first.has("PushTasks", "cut")
    monkeypatch.setenv(faults.RULES_ENV, "PushTasks.drop=every2")
    second = faults.current()
    assert second is not first and second is not None and second.has("PushTasks", "drop")
    monkeypatch.delenv(faults.TESTING_ENV)
    assert faults.current() is None


def test_a_frozen_process_keeps_the_injector_it_had(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.RULES_ENV, "CreateActor=0:0.5")
    monkeypatch.setenv(faults.TESTING_ENV, "1")
    faults.freeze()  # a cluster process, once started
    first = faults.current()
    assert first is not None and first.has("CreateActor", "reply")
    monkeypatch.delenv(faults.TESTING_ENV)
    assert faults.current() is first  # not read again


def test_every_n_fires_on_each_nth_event_and_is_recorded(tmp_path: Path) -> None:
    inj = faults.FaultInjector("PushTasks.cut=every3,PushTasks.drop=0", record_dir=str(tmp_path))
    fired = [inj.fire("PushTasks", "cut") for _ in range(9)]
    assert fired == [False, False, True] * 3
    assert not any(inj.fire("PushTasks", "drop") for _ in range(50))
    assert not inj.fire("Other", "cut")  # no rule, never
    assert inj.injected == 3 and inj.counts[("PushTasks", "cut")] == 3
    other = faults.FaultInjector("CreateActor=0:every1", record_dir=str(tmp_path))
    assert other.fire("CreateActor", "reply") and not other.fire("CreateActor", "request")
    # Both "processes" wrote to the same pid file here; counts add up by method and kind.
    assert faults.fired(tmp_path) == {("PushTasks", "cut"): 3, ("CreateActor", "reply"): 1}


def test_probabilities_and_the_wildcard_cover_unary_methods_only() -> None:
    inj = faults.FaultInjector("*=1:0", seed=1)
    assert inj.fire("RequestWorkerLease", "request")
    assert not inj.fire("RequestWorkerLease", "reply")
    assert not inj.fire("PushTasks", "cut")  # streams need an explicit rule
    half = faults.FaultInjector("X.reply=0.5", seed=2)
    hits = sum(half.fire("X", "reply") for _ in range(2000))
    assert 800 < hits < 1200
    assert all(1 <= half.pick(5) <= 5 for _ in range(100))
    assert half.pick(1) == 1


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("PushTasks", "needs '='"),
        ("PushTasks.chop=0.1", "unknown fault kind"),
        ("X=2:0", "between 0 and 1"),
        ("X.cut=every0", "N >= 1"),
    ],
)
def test_bad_rules_are_refused_with_the_reason(spec: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        faults.FaultInjector(spec)


def test_fired_ignores_other_files(tmp_path: Path) -> None:
    (tmp_path / "faults-1.log").write_text("PushTasks cut\nPushTasks drop\n\n")
    (tmp_path / "notes.txt").write_text("PushTasks cut\n")
    assert faults.fired(tmp_path) == {("PushTasks", "cut"): 1, ("PushTasks", "drop"): 1}
    assert faults.fired(tmp_path / "missing") == {}
