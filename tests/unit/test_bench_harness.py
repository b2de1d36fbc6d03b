"""The benchmark scripts' child runner (``benchmarks/_harness.py``), with real processes.

A child runs in its own process group; whatever it leaves behind is ended by that group's
id once it exits (after a grace period) or at once when it overstays its time limit. Its
records become the system's entry of the report.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_harness() -> ModuleType:
    """benchmarks/ is a folder of scripts, not a package: load the module by its path."""
    spec = importlib.util.spec_from_file_location("_harness", BENCH / "_harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_harness"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


_harness = _load_harness()

# A child that starts a grandchild in its own process group, writes the grandchild's pid,
# then exits without ending it (a cluster process left behind); or sleeps past its limit.
LEAVER = """
import subprocess, sys, time
mode, pidfile = sys.argv[1], sys.argv[2]
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(pidfile, "w").write(str(g.pid))
if mode == "hang":
    time.sleep(300)
"""


def _gone(pid: int, within_s: float = 30.0) -> bool:
    """True once ``pid`` no longer runs (gone, or a zombie waiting for its reaper)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _wait_for(path: Path, within_s: float = 30.0) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_the_childs_group_is_ended(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    pidfile = tmp_path / "grandchild.pid"
    logfile = tmp_path / "child.log"
    run = _harness.run_child(
        str(script),
        [mode, str(pidfile)],
        timeout_s=3 if mode == "hang" else 60,
        logfile=logfile,
        grace_s=0.5,
    )
    grandchild = int(_wait_for(pidfile))
    try:
        if mode == "exit":
            assert run.returncode == 0 and run.why == "exited 0"
        else:
            assert run.returncode is None and run.why == "timed out"
        assert _gone(grandchild), "the grandchild the child left behind still runs"
    finally:
        if not _gone(grandchild, 0):
            os.kill(grandchild, 9)  # only our own grandchild, by its pid


CHILD = """
import sys
from _harness import record_workload

out = sys.argv[sys.argv.index("--_out") + 1]
record_workload("sys", out, "good", lambda: 1.5)
record_workload("sys", out, "bad", lambda: 1 / 0)
record_workload("sys", out, "many", lambda: {"a": 1, "b": 2}, expand=True)

def missing():
    raise NotImplementedError

record_workload("sys", out, "none", missing, skip=(NotImplementedError,))
sys.exit(3)
"""


def test_run_system_collects_the_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])
    )
    entry = _harness.run_system(
        str(script), "sys", lambda: "1.0", workdir=tmp_path, timeout_s=60, grace_s=0.5
    )
    assert entry["status"] == "ok" and entry["version"] == "1.0"
    assert entry["results"] == {"good": 1.5, "a": 1, "b": 2}
    assert entry["errors"]["bad"].startswith("ZeroDivisionError")
    assert entry["errors"]["run"] == f"child exited 3; log: {tmp_path / 'sys.log'}"
    assert "none" not in entry["results"] and "none" not in entry["errors"]


def test_a_system_that_is_not_installed_runs_nothing(tmp_path: Path) -> None:
    def version() -> str:
        return _harness.package_version("no_such_module_for_the_bench_harness")

    entry = _harness.run_system(
        str(tmp_path / "never.py"), "sys", version, workdir=tmp_path, timeout_s=60
    )
    assert entry == {"results": {}, "errors": {}, "status": "not installed"}
    assert not (tmp_path / "sys.log").exists()


def test_format_table_aligns_and_rules() -> None:
    rows = [["workload", "unit", "a", "b"], ["x", "s", "1.00", "123"], ["longer", "", "", "4"]]
    assert _harness.format_table(rows) == [
        "workload  unit     a    b",
        "-------------------------",
        "x         s     1.00  123",
        "longer                  4",
    ]
    assert (
        _harness.format_table(
            [["m", "10", ""], ["k", "1", "flat"]], right=slice(1, None), indent="  ", full_rule=True
        )[1]
        == "  " + "-" * 11  # 1 + 2 + 4 wide, two blanks apart: wider than the head "m  10"
    )
    assert _harness.better(2.0, 1.0, True) == 2.0 and _harness.better(2.0, 1.0, False) == 0.5
    assert _harness.better(None, 1.0, True) is None
    assert [_harness.fmt(v) for v in (12345.0, 12.34, 1.234, -250.0)] == [
        "12,345",
        "12.3",
        "1.23",
        "-250",
    ]
    assert _harness.fmt(0.0123, 0.1) == "0.012"
