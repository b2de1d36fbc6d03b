"""runtime_env for tasks and actors on a real cluster (issue 17 item 2).

One driver per module with a job-level environment; tasks and actors add theirs. Covers
Ray's inheritance, working_dir/py_modules (packed once, cached per node, excludes),
workers pooled per environment, pip environments (cold, cached, bad spec, timeout), and
the setup progress reaching the submitter's output handler.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import exceptions as exc
from nbcluster import state
from nbcluster._runtime.runtime_env import pip_env
from nbcluster.testing import assert_no_processes

pytestmark = pytest.mark.integration


def _local_index() -> str | None:
    """The machine's local package index (file://), from pip's configuration."""
    flags = pip_env.pip_config_flags()
    for i, flag in enumerate(flags):
        if flag in ("--index-url", "--extra-index-url") and flags[i + 1].startswith("file://"):
            return flags[i + 1]
    return None


LOCAL_INDEX = _local_index()
needs_index = pytest.mark.skipif(
    LOCAL_INDEX is None, reason="pip has no local (file://) package index configured here"
)


def _offline_pip(*packages: str) -> dict[str, Any]:
    """A pip spec that only reads the local index (never the network)."""
    return {"packages": list(packages), "pip_install_options": ["--index-url", str(LOCAL_INDEX)]}


@pytest.fixture(scope="module")
def driver(env_cache: Path) -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2, runtime_env={"env_vars": {"JOB_VAR": "job"}})
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


@nbcluster.remote
def env_of(*names: str) -> dict[str, Any]:
    return {n: os.environ.get(n) for n in names} | {"pid": os.getpid(), "cwd": os.getcwd()}


@nbcluster.remote
def child_env(*names: str) -> dict[str, Any]:
    return nbcluster.get(env_of.remote(*names))


def test_env_vars_follow_rays_inheritance(driver: Any) -> None:
    assert nbcluster.get(env_of.remote("JOB_VAR", "T"))["JOB_VAR"] == "job"
    got = nbcluster.get(
        env_of.options(runtime_env={"env_vars": {"T": "task"}}).remote("JOB_VAR", "T")
    )
    assert (got["JOB_VAR"], got["T"]) == ("job", "task")
    # A child task inherits its parent's environment, merged with the job's.
    nested = nbcluster.get(
        child_env.options(runtime_env={"env_vars": {"T": "parent"}}).remote("JOB_VAR", "T")
    )
    assert (nested["JOB_VAR"], nested["T"]) == ("job", "parent")

    @nbcluster.remote(runtime_env={"env_vars": {"A": "actor", "JOB_VAR": "override"}})
    class Holder:
        def env(self) -> dict[str, Any]:
            return {"A": os.environ.get("A"), "JOB_VAR": os.environ.get("JOB_VAR")}

    assert nbcluster.get(Holder.remote().env.remote()) == {"A": "actor", "JOB_VAR": "override"}


def test_workers_are_pooled_per_environment(driver: Any) -> None:
    a = {"env_vars": {"POOL": "a"}}
    first = nbcluster.get(env_of.options(runtime_env=a).remote("POOL"))
    second = nbcluster.get(env_of.options(runtime_env=a).remote("POOL"))
    other = nbcluster.get(env_of.options(runtime_env={"env_vars": {"POOL": "b"}}).remote("POOL"))
    plain = nbcluster.get(env_of.remote("POOL"))
    assert first["pid"] == second["pid"] and first["POOL"] == "a"
    assert other["pid"] != first["pid"] and other["POOL"] == "b"
    assert plain["POOL"] is None and plain["pid"] not in (first["pid"], other["pid"])


def test_working_dir_and_py_modules_are_shipped_once_and_excludes_honoured(
    driver: Any, tmp_path: Path, env_cache: Path
) -> None:
    wd = tmp_path / "project"
    (wd / "data").mkdir(parents=True)
    (wd / "helper.py").write_text("VALUE = 'from working_dir'\n")
    (wd / "data" / "skip.csv").write_text("x\n")
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("NAME = 'mylib'\n")

    @nbcluster.remote
    def use() -> tuple[str, str, bool, str]:
        import helper
        import mylib

        return helper.VALUE, mylib.NAME, os.path.exists("data/skip.csv"), os.getcwd()

    env = {"working_dir": str(wd), "py_modules": [str(lib)], "excludes": ["*.csv"]}
    results = nbcluster.get([use.options(runtime_env=env).remote() for _ in range(4)])
    value, name, has_csv, cwd = results[0]
    assert (value, name, has_csv) == ("from working_dir", "mylib", False)
    assert Path(cwd).parent == env_cache / "packages"  # unpacked once into the node's cache
    session = Path(driver.session_dir)
    assert len(list((session / "runtime_env" / "packages").iterdir())) == 2  # uploaded once each


def test_progress_of_a_setup_reaches_the_submitters_output(driver: Any, tmp_path: Path) -> None:
    seen: list[Any] = []
    state.set_output_handler(lambda ctx, rec: seen.append(rec))
    try:
        (tmp_path / "m.py").write_text("X = 1\n")
        nbcluster.get(env_of.options(runtime_env={"working_dir": str(tmp_path)}).remote())
        deadline = time.monotonic() + 10
        while not any("unpack" in r.text for r in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        state.set_output_handler(None)
    texts = [r.text for r in seen if r.task_name == "runtime_env"]
    assert any("download" in t for t in texts) and any("unpack" in t for t in texts), texts


@needs_index
def test_pip_environment_is_built_once_and_layered_over_the_base(
    driver: Any, env_cache: Path
) -> None:
    @nbcluster.remote
    def which() -> tuple[str, str, str]:
        import sys

        import numpy  # from the base environment
        import termcolor  # from the runtime_env's

        return sys.executable, termcolor.__file__, numpy.__file__

    spec = {"pip": _offline_pip("termcolor")}
    exe, mod, base = nbcluster.get(which.options(runtime_env=spec).remote())
    envs = [p for p in (env_cache / "pip").iterdir() if p.is_dir()]
    assert len(envs) == 1 and (envs[0] / ".ready").exists()
    assert exe.startswith(str(envs[0])) and mod.startswith(str(envs[0]))
    assert not base.startswith(str(envs[0]))
    assert (env_cache / "pip" / f"{envs[0].name}.install.log").exists()
    again = nbcluster.get(which.options(runtime_env=spec).remote())
    assert again[0] == exe
    with pytest.raises(ImportError):
        nbcluster.get(which.remote())  # the plain workers never see the package


@needs_index
def test_a_bad_pip_spec_names_the_package_and_the_log_and_is_not_kept(
    driver: Any, env_cache: Path
) -> None:
    bad = {"pip": _offline_pip("nonexistent-package-xyz-17")}
    with pytest.raises(exc.RuntimeEnvSetupError) as info:
        nbcluster.get(env_of.options(runtime_env=bad).remote())
    text = str(info.value)
    assert "'nonexistent-package-xyz-17' could not be installed" in text
    log = text.split("Full install log: ")[1].split()[0]
    assert Path(log).exists() and "nonexistent-package-xyz-17" in Path(log).read_text()
    assert not Path(log.removesuffix(".install.log")).exists()  # no half-built environment

    @nbcluster.remote(runtime_env=bad)
    class Broken:
        def ping(self) -> int:
            return 1

    with pytest.raises(exc.NbclusterError, match=r"RuntimeEnvSetupError"):
        nbcluster.get(Broken.remote().ping.remote(), timeout=60)
    assert nbcluster.get(env_of.remote("JOB_VAR"))["JOB_VAR"] == "job"  # the cluster is fine


def test_setup_timeout_fails_the_task_and_cleans_up(driver: Any, env_cache: Path) -> None:
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)  # accepts connections, never answers: the installer waits
    url = f"http://127.0.0.1:{hang.getsockname()[1]}/simple"
    env = {
        "pip": {
            "packages": ["only-on-the-hanging-index"],
            "pip_install_options": ["--index-url", url],
        },
        "config": {"setup_timeout_seconds": 2},
    }
    try:
        with pytest.raises(exc.RuntimeEnvSetupError, match=r"setup_timeout_seconds=2"):
            nbcluster.get(env_of.options(runtime_env=env).remote(), timeout=60)
    finally:
        hang.close()
    pip_dir = env_cache / "pip"
    half_built = [p for p in pip_dir.iterdir() if p.is_dir() and not (p / ".ready").exists()]
    assert half_built == []
