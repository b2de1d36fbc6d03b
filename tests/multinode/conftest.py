"""Several "hosts" on one machine: network namespaces on a private bridge.

The fixture builds a bridge in its own namespace and one namespace per host, each with a
veth into the bridge and an address in a private /24 (unique per run). Nothing is ever
sent from the root namespace to those addresses: every process that talks to the cluster
runs inside a host namespace (``ip netns exec``). Everything is deleted afterwards.
Needs root (``ip netns add``) and iproute2. Elsewhere the tests are skipped with the reason,
except under ``CI=true``, where they fail: CI must run them (``make test`` installs iproute2).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _namespaces_available() -> str | None:
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"nbcprobe{secrets.token_hex(3)}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"'ip netns add' failed here: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _in_ci(environ: dict[str, str] | None = None) -> bool:
    """True when running under CI (``CI`` set to true/1/yes, as CI services do)."""
    value = (environ if environ is not None else os.environ).get("CI", "")
    return value.strip().lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> NoReturn:
    """No namespaces here: skip, or fail under CI (where a skip would hide lost coverage)."""
    message = f"multi-host tests need network namespaces: {reason}"
    if _in_ci():
        pytest.fail(f"{message} (CI=true: these tests must run in CI, not be skipped)")
    pytest.skip(message)


@pytest.fixture
def namespaces_unavailable() -> Callable[[str], NoReturn]:
    """What the ``hosts`` fixture does when namespaces cannot be made (for its own test)."""
    return _unavailable


@dataclass
class Hosts:
    """The namespaces of one run: names and addresses, plus the processes started in them."""

    prefix: str
    subnet: str
    names: list[str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    output: dict[int, list[str]] = field(default_factory=dict)

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def env(self, i: int, tmp: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NBCLUSTER_")}
        env.update(
            NBCLUSTER_TOKEN=self.token,
            NBCLUSTER_TEMP_DIR=str(tmp / f"host{i}"),
            NBCLUSTER_HEARTBEAT_INTERVAL_S="0.25",
            NBCLUSTER_NODE_DEATH_TIMEOUT_S="3",
            PYTHONPATH=str(REPO),
            **extra,
        )
        return env

    def spawn(
        self, i: int, argv: list[str], env: dict[str, str], stdin: bool = False
    ) -> subprocess.Popen[str]:
        """Start a process inside host ``i``'s namespace (its own process group); with
        ``stdin`` the test can write to it (to tell it when to go on)."""
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.names[i], *argv],
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.procs.append(p)
        lines: list[str] = []
        self.output[p.pid] = lines

        def pump() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                lines.append(line)

        threading.Thread(target=pump, daemon=True).start()
        return p

    def run(
        self, i: int, argv: list[str], env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a command to completion inside host ``i``'s namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.names[i], *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    """Three hosts (namespaces) on a private bridge; torn down after the test."""
    reason = _namespaces_available()
    if reason:
        _unavailable(reason)
    run = secrets.token_hex(2)
    prefix = f"nbc{run}"
    subnet = f"10.77.{int(run, 16) % 250 + 1}"
    names = [f"{prefix}h{i}" for i in range(3)]
    sw = f"{prefix}sw"
    created: list[str] = []
    h = Hosts(prefix, subnet, names)
    try:
        _ip("netns", "add", sw)
        created.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        _ip("-n", sw, "link", "set", "lo", "up")
        for i, ns in enumerate(names):
            _ip("netns", "add", ns)
            created.append(ns)
            _ip(
                "link",
                "add",
                f"v{prefix}{i}",
                "netns",
                sw,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", sw, "link", "set", f"v{prefix}{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{h.addr(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield h
    finally:
        h.stop_all()
        for ns in reversed(created):
            _ip("netns", "del", ns, check=False)


def python() -> str:
    """The interpreter of this test run (the project's venv)."""
    return sys.executable
