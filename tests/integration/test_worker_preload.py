"""A worker forked by the node's zygote imports none of its start-up modules itself.

The node manager loads ``zygote.WORKER_MODULES`` before it forks the zygote, so a new
worker inherits them instead of importing (and, without .pyc files, compiling) them:
that was most of a new worker's start-up CPU, the bound on creating 1,000 actors.
Checked with Python's ``-X importtime`` (``PYTHONPROFILEIMPORTTIME``): inherited by the
node manager, it makes every import done after the fork print a line to the worker's log.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbcluster
from nbcluster._runtime.node.zygote import WORKER_MODULES


@nbcluster.remote(num_cpus=0)
class Probe:
    def pid(self) -> int:
        return os.getpid()

    def import_late(self) -> str:
        import colorsys  # a module nothing loads before: its import must show in the log

        return colorsys.__name__


@nbcluster.remote
def square(x: int) -> int:
    return x * x


def test_workers_import_none_of_their_start_up_modules_after_the_fork(cluster, monkeypatch):
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    info = cluster(num_cpus=1)
    actors = [Probe.remote() for _ in range(2)]
    assert len(set(nbcluster.get([a.pid.remote() for a in actors], timeout=60))) == 2
    assert nbcluster.get(square.remote(7), timeout=60) == 49
    assert nbcluster.get(actors[0].import_late.remote(), timeout=60) == "colorsys"
    logs = sorted((Path(info.session_dir) / "logs").glob("worker-*.log"))
    assert len(logs) >= 3
    imported: dict[str, list[str]] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("import time:") and "|" in line:
                imported.setdefault(log.name, []).append(line.rsplit("|", 1)[1].strip())
    # the probe works: an import done in a worker after the fork is in its log
    assert any("colorsys" in mods for mods in imported.values()), imported
    late = {
        name: [m for m in mods if m in WORKER_MODULES or m.split(".")[0] == "uvloop"]
        for name, mods in imported.items()
    }
    assert not any(late.values()), f"imported after the fork: {late}"
