"""The head gone, from a kernel (issue 12, item 5; RELIABILITY F11b and J03 for a driver).

The cluster is a separate process tree this test owns, so the test can SIGKILL its head
under a running notebook and start it again on the same address. A real ipykernel joins
it with ``%cluster connect``; every task, actor constructor and actor call of the notebook
appends a line to a file named after it, so the end of the test can count executions.

- A cell waits on a call to an actor the head has not placed yet (actor creation needs
  the head, as in Ray) when the head is killed: the cell ends with ``HeadUnavailableError``
  (its error output, as the notebook shows it) within the grace period plus a margin.
- The kernel lives on: the next cells run; a task in flight finishes, new tasks run,
  ``%cluster status`` says the state is unavailable and ``%cluster widgets`` opens,
  instead of hanging or failing.
- The head restarts on the same address: the same kernel (same process, no reconnect by
  hand) runs new tasks and actors, the old actor answers, the actor created during the
  outage becomes ready, results made before the outage are still readable, and the
  dashboard opened before the outage shows the tasks run after it.
- Every task, constructor and call ran exactly once; the failed call never ran.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbcluster import LocalCluster
from nbcluster.testing import assert_no_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The kernel's grace period for an unreachable head (NBCLUSTER_HEAD_GRACE_PERIOD_S).
GRACE_S = 3.0
#: The grace period plus a generous margin for a loaded CI machine (a hang is minutes).
ERROR_DEADLINE_S = GRACE_S + 27.0

DEFINE = """
import os
import time
from pathlib import Path

import nbcluster

RUNS = Path({runs!r})
GATE = Path({gate!r})


def ran(tag):
    with open(RUNS / tag, "a") as f:
        f.write(f"{{os.getpid()}}\\n")


@nbcluster.remote
def record(tag):
    ran(tag)
    return tag, b"x" * 300_000  # in the object store, not inline


@nbcluster.remote
def held(tag):
    ran(tag)
    print("held started", flush=True)
    while not GATE.exists():
        time.sleep(0.05)
    return tag


@nbcluster.remote
class Probe:
    def __init__(self, tag):
        ran(tag)

    def ping(self, tag):
        ran(tag)
        return tag
"""

BEFORE = """
before = [record.remote(f"before-{i}") for i in range(10)]
assert [t for t, _ in nbcluster.get(before)] == [f"before-{i}" for i in range(10)]
probe = Probe.remote("probe-ctor")
assert nbcluster.get(probe.ping.remote("probe-before")) == "probe-before"
"""

# The live dashboard (its feed holds the head's event stream) shows the tasks so far.
DASHBOARD = """
from nbcluster.jupyter.widgets import dashboard
from nbcluster.testing import poll_for

def records(view):
    got = view.timeline.summary.get("record")
    return got.count if got is not None else 0

dash = dashboard()
display(dash)
poll_for(lambda: records(dash) >= 10, timeout=30, message="the timeline never saw the tasks")
"""

# Both CPUs are needed by the actor; ``held`` keeps one until the gate opens, so the head
# cannot place the actor yet: the call waits for the head to say where the actor lives.
WAITS_ON_THE_HEAD = """
pending = Probe.options(num_cpus=2).remote("pending-ctor")
print("REGISTERED", flush=True)
nbcluster.get(pending.ping.remote("pending-call"))
"""

DURING = """
assert nbcluster.get(during, timeout=60) == "during"
outage = [record.remote(f"outage-{i}") for i in range(3)]
assert [t for t, _ in nbcluster.get(outage, timeout=60)] == [f"outage-{i}" for i in range(3)]
"""

AFTER = """
deadline = time.monotonic() + 60
while True:  # the head is back once it answers (a missing name is an answer)
    try:
        nbcluster.get_actor("no-such-actor")
    except ValueError:
        break
    except nbcluster.exceptions.HeadUnavailableError:
        assert time.monotonic() < deadline, "the kernel's driver never reached the head again"
assert nbcluster.get(probe.ping.remote("probe-after"), timeout=60) == "probe-after"
assert nbcluster.get(pending.ping.remote("pending-after"), timeout=60) == "pending-after"
nbcluster.kill(pending)
after = [record.remote(f"after-{i}") for i in range(5)]
assert [t for t, _ in nbcluster.get(after, timeout=60)] == [f"after-{i}" for i in range(5)]
fresh = Probe.remote("fresh-ctor")
assert nbcluster.get(fresh.ping.remote("fresh-call"), timeout=60) == "fresh-call"
assert [t for t, _ in nbcluster.get(before + outage, timeout=60)] == (
    [f"before-{i}" for i in range(10)] + [f"outage-{i}" for i in range(3)]
)
# The dashboard opened before the outage follows the restarted head: only the new head's
# events take it past 13 (10 before, 3 in the outage, 5 after).
poll_for(lambda: records(dash) >= 15, timeout=30, message="the dashboard stopped updating")
print("AFTER OK", flush=True)
"""


@pytest.fixture
def owned_cluster() -> Iterator[LocalCluster]:
    """A 2-CPU cluster owned by this test process (not by the kernel), stopped at the end."""
    cluster = LocalCluster(num_cpus=2).start()
    try:
        yield cluster
    finally:
        session_dir = cluster.session_dir
        cluster.stop()
        assert session_dir is not None
        assert_no_processes(session_dir, timeout=15)


def error_output(k: Any, msg_id: str) -> dict[str, Any] | None:
    """The cell's ``error`` output (what the notebook shows under it), if it has one."""
    for m in k.messages:
        if m["msg_type"] == "error" and m["parent_header"].get("msg_id") == msg_id:
            return dict(m["content"])
    return None


def shown_text(k: Any, msg_id: str) -> str:
    """The cell's streams and the text/plain of what it displayed, as the notebook shows them."""
    parts = []
    for m in k.messages:
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "stream":
            parts.append(m["content"]["text"])
        elif m["msg_type"] in ("execute_result", "display_data"):
            parts.append(m["content"]["data"].get("text/plain", ""))
    return "".join(parts)


def test_head_killed_under_a_running_notebook_and_restarted(
    kernel: Any, owned_cluster: LocalCluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    gate = tmp_path / "gate"
    token_file = Path(str(owned_cluster.session_dir)) / "token"
    k = kernel(
        env={"NBCLUSTER_TOKEN_FILE": str(token_file), "NBCLUSTER_HEAD_GRACE_PERIOD_S": str(GRACE_S)}
    )
    k.run(f"%load_ext nbcluster\n%cluster connect {owned_cluster.address}")
    k.run(DEFINE.format(runs=str(runs), gate=str(gate)))
    kernel_pid = k.eval_text("os.getpid()")
    k.run(BEFORE)
    k.run(DASHBOARD)
    started = k.run('during = held.remote("during")')
    k.wait_for(lambda: "held started" in k.task_output(started), what="the held task to run")

    # -- the head dies under a cell that waits on something only the head can give --------
    cell = k.submit(WAITS_ON_THE_HEAD)
    k.wait_for(lambda: "REGISTERED" in k.stream_text(cell), what="the actor to be registered")
    owned_cluster.kill_head()
    killed_at = time.monotonic()
    reply = k.wait_done(cell, timeout=ERROR_DEADLINE_S)
    waited = time.monotonic() - killed_at
    shown = error_output(k, cell)
    assert shown is not None, f"the cell shows no error; reply: {reply['content']}"
    assert shown["ename"] == "HeadUnavailableError", shown
    assert "head cannot be reached" in shown["evalue"], shown
    assert reply["content"]["status"] == "error"
    assert waited < ERROR_DEADLINE_S  # the grace period, not a hang

    # -- the kernel lives on: work that does not need the head goes on ---------------------
    gate.touch()
    k.run(DURING)
    status = k.run("%cluster status")
    assert "Cluster state unavailable" in shown_text(k, status), shown_text(k, status)
    k.run("%cluster widgets")  # a new dashboard while the head is away: no error, no hang
    assert k.eval_text("os.getpid()") == kernel_pid

    # -- the head comes back: the same kernel carries on --------------------------------------
    owned_cluster.restart_head()
    done = k.run(AFTER, timeout=120)
    assert "AFTER OK" in k.stream_text(done)
    assert k.eval_text("os.getpid()") == kernel_pid, "the kernel was restarted"
    k.run("%cluster stop")

    # -- every execution counted: each ran once, the failed call never ran -------------------
    counts = {p.name: len(p.read_text().splitlines()) for p in runs.iterdir()}
    expected = {
        *(f"before-{i}" for i in range(10)),
        "probe-ctor",
        "probe-before",
        "during",
        "pending-ctor",
        *(f"outage-{i}" for i in range(3)),
        "probe-after",
        "pending-after",
        *(f"after-{i}" for i in range(5)),
        "fresh-ctor",
        "fresh-call",
    }
    assert set(counts) == expected, sorted(set(counts) ^ expected)
    twice = {tag: n for tag, n in counts.items() if n != 1}
    assert not twice, f"ran more than once: {twice}"
