"""Config: defaults, NBCLUSTER_* environment variables, overrides, to_env round trip."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import logging
import sys

import pytest

from nbcluster._runtime import config as config_mod
from nbcluster.config import Config


def test_defaults() -> None:
    cfg = Config()
    assert cfg.max_inline_bytes == 100 * 1024
    assert cfg.heartbeat_interval_s == 0.5
    assert cfg.node_death_timeout_s == 30.0
    assert cfg.lease_idle_timeout_s == 0.5
    assert cfg.max_tasks_in_flight_per_worker == 32
    assert cfg.object_store_memory is None
    assert cfg.store_base_dir == "/dev/shm"
    assert cfg.spill_dir is None
    assert cfg.spilling_enabled is True
    assert cfg.temp_dir == "/tmp/nbcluster"
    assert cfg.function_size_warn_bytes == 10 * 2**20
    assert cfg.function_size_error_bytes == 100 * 2**20
    assert cfg.infeasible_warning_s == 2.0
    assert cfg.head_grace_period_s == 30.0
    assert cfg.rpc_max_message_bytes == 512 * 2**20
    assert cfg.worker_prestart is None
    assert cfg.log_level == "WARNING"
    assert cfg.task_events_capacity == 100_000


def test_every_field_has_a_docstring() -> None:
    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        stmt.target.id
        for stmt, nxt in zip(body, body[1:], strict=False)
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
        and isinstance(nxt.value.value, str)
    }
    assert Config.field_names() <= documented


def test_from_env_without_variables_gives_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Config.field_names():
        monkeypatch.delenv(Config.env_var(name), raising=False)
    assert Config.from_env() == Config()


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_HEARTBEAT_INTERVAL_S", "0.05")
    monkeypatch.setenv("NBCLUSTER_SPILLING_ENABLED", "false")
    monkeypatch.setenv("NBCLUSTER_OBJECT_STORE_MEMORY", "1_000_000")
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", "/tmp/x y")
    cfg = Config.from_env()
    assert cfg.heartbeat_interval_s == 0.05
    assert cfg.spilling_enabled is False
    assert cfg.object_store_memory == 1_000_000
    assert cfg.temp_dir == "/tmp/x y"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), (" on ", True)]
    + [("0", False), ("False", False), ("no", False), ("off", False)],
)
def test_bool_parsing(raw: str, expected: bool) -> None:
    assert Config.from_env({"NBCLUSTER_SPILLING_ENABLED": raw}).spilling_enabled is expected


@pytest.mark.parametrize("raw", ["", "none", "None", "null"])
def test_optional_fields_read_none(raw: str) -> None:
    env = {"NBCLUSTER_WORKER_PRESTART": raw, "NBCLUSTER_SPILL_DIR": raw}
    cfg = Config.from_env(env)
    assert cfg.worker_prestart is None
    assert cfg.spill_dir is None


def test_ints_are_accepted_for_floats() -> None:
    cfg = Config.from_env({"NBCLUSTER_NODE_DEATH_TIMEOUT_S": "5"}, head_grace_period_s=3)
    assert cfg.node_death_timeout_s == 5.0
    assert isinstance(cfg.head_grace_period_s, float)


def test_overrides_win_over_the_environment() -> None:
    env = {"NBCLUSTER_MAX_INLINE_BYTES": "10", "NBCLUSTER_LOG_LEVEL": "info"}
    cfg = Config.from_env(env, max_inline_bytes=20)
    assert cfg.max_inline_bytes == 20
    assert cfg.log_level == "INFO"
    assert cfg.logging_level() == logging.INFO


def test_unrelated_nbcluster_variables_are_ignored() -> None:
    assert Config.from_env({"NBCLUSTER_TOKEN": "secret", "NBCLUSTER_NOPE": "1"}) == Config()


@pytest.mark.parametrize(
    ("var", "raw", "message"),
    [
        (
            "NBCLUSTER_HEARTBEAT_INTERVAL_S",
            "fast",
            r"^NBCLUSTER_HEARTBEAT_INTERVAL_S must be a number, got 'fast'$",
        ),
        (
            "NBCLUSTER_SPILLING_ENABLED",
            "maybe",
            r"^NBCLUSTER_SPILLING_ENABLED must be 1/true/yes/on or 0/false/no/off, got 'maybe'$",
        ),
        (
            "NBCLUSTER_MAX_INLINE_BYTES",
            "1.5",
            r"^NBCLUSTER_MAX_INLINE_BYTES must be an integer, got '1\.5'$",
        ),
        (
            "NBCLUSTER_WORKER_PRESTART",
            "many",
            r"^NBCLUSTER_WORKER_PRESTART must be an integer \(or empty for the default\), "
            r"got 'many'$",
        ),
    ],
)
def test_bad_environment_values_name_the_variable(var: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.from_env({var: raw})


def test_out_of_range_values_name_the_field_and_the_variable() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Config\.heartbeat_interval_s \(NBCLUSTER_HEARTBEAT_INTERVAL_S\) must be > 0, "
        r"got 0\.0$",
    ):
        Config.from_env({"NBCLUSTER_HEARTBEAT_INTERVAL_S": "0"})
    with pytest.raises(ValueError, match=r"^Config\.infeasible_warning_s .* must be >= 0"):
        Config(infeasible_warning_s=-1)
    with pytest.raises(ValueError, match=r"must be a finite number, got nan$"):
        Config(head_grace_period_s=float("nan"))
    with pytest.raises(ValueError, match=r"^Config\.log_level .* must be one of DEBUG, INFO"):
        Config(log_level="LOUD")
    with pytest.raises(ValueError, match=r"must not exceed function_size_error_bytes"):
        Config(function_size_warn_bytes=200 * 2**20)


def test_wrong_types_are_refused() -> None:
    with pytest.raises(
        TypeError,
        match=r"^Config\.max_inline_bytes \(NBCLUSTER_MAX_INLINE_BYTES\) must be an integer, "
        r"got True \(bool\)$",
    ):
        Config(max_inline_bytes=True)
    with pytest.raises(TypeError, match=r"^Config\.temp_dir .* cannot be None$"):
        Config(temp_dir=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Config\.spilling_enabled .* must be True or False"):
        Config(spilling_enabled=1)  # type: ignore[arg-type]


def test_unknown_override_is_refused_with_a_suggestion() -> None:
    with pytest.raises(
        TypeError,
        match=r"^Unknown config option 'heartbeat_interval'\. Valid options: .*"
        r"Did you mean 'heartbeat_interval_s'\?$",
    ):
        Config.from_env({}, heartbeat_interval=1)


def test_to_env_has_only_non_default_values_and_round_trips() -> None:
    assert Config().to_env() == {}
    cfg = Config.from_env(
        {},
        heartbeat_interval_s=0.1,
        spilling_enabled=False,
        object_store_memory=2**28,
        spill_dir="/tmp/spill",
        log_level="debug",
    )
    env = cfg.to_env()
    assert env == {
        "NBCLUSTER_HEARTBEAT_INTERVAL_S": "0.1",
        "NBCLUSTER_SPILLING_ENABLED": "0",
        "NBCLUSTER_OBJECT_STORE_MEMORY": str(2**28),
        "NBCLUSTER_SPILL_DIR": "/tmp/spill",
        "NBCLUSTER_LOG_LEVEL": "DEBUG",
    }
    assert Config.from_env(env) == cfg


def test_config_is_frozen_and_replace_validates() -> None:
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_inline_bytes = 1  # type: ignore[misc]
    assert cfg.replace(max_inline_bytes=1).max_inline_bytes == 1
    with pytest.raises(ValueError, match=r"must be >= 0"):
        cfg.replace(max_inline_bytes=-1)


def test_import_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_HEARTBEAT_INTERVAL_S", "not a number")
    # Execute a fresh copy of the module under another name (nbcluster.config stays as is).
    spec = importlib.util.spec_from_file_location("_config_probe", config_mod.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_config_probe", fresh)
    spec.loader.exec_module(fresh)  # must not raise: the environment is read only on demand
    with pytest.raises(ValueError, match=r"^NBCLUSTER_HEARTBEAT_INTERVAL_S must be a number"):
        fresh.Config.from_env()
