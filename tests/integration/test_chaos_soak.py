"""F14 (RELIABILITY.md), the short run: ``benchmarks/chaos_soak.py --quick`` under pytest.

Node managers are SIGKILLed every few seconds (and replaced) while nested tasks and
restartable actors run; every result and every sequence number must be there, and the
cluster must come back (resources, CPU, head memory). The long run is documented in
``benchmarks/README.md`` (30 minutes, 1 head + 4 nodes, a kill a minute).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_f14_chaos_soak_quick(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBCLUSTER_")}
    env.update(NBCLUSTER_TEMP_DIR=str(tmp_path / "sessions"), PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "chaos_soak.py"), "--quick", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.exists(), r.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["passed"], json.dumps(summary, indent=2) + r.stderr[-3000:]
    assert r.returncode == 0
    assert summary["kills"] >= 1 and summary["missing_sequence_numbers"] == {}
    assert summary["tasks"] > 0 and summary["steps"] > 0
