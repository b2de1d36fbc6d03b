"""The Jupyter layer in a real ipykernel, driven over ZMQ with jupyter_client.

(a) task output goes into the log area of the cell that submitted the task, even after
    it finished (or, with ``%cluster output stream``, under it as stream messages);
(b) a flood of output is folded and reaches the notebook in a bounded number of messages;
(c) interrupting a cell that waits cancels its tasks and the cluster stays usable (J02);
(d) the cluster dies with the kernel: SIGKILL and restart (J01).
"""

from __future__ import annotations

import re
import signal

import pytest

from nbcluster.testing import assert_no_processes, cluster_processes, kill_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEAK = """
import time
import nbcluster

@nbcluster.remote
def speak(delay, word):
    time.sleep(delay)
    print(word)
    return word
"""


def test_late_output_lands_in_the_finished_cells_log_area(kernel):
    """(a) Output of a task that prints after its cell finished, while another cell runs,
    goes into the first cell's log area (the widget under it), not under the running cell."""
    k = kernel()
    k.start_cluster("--num-cpus 1")
    k.run(SPEAK)
    cell_a = k.submit("late_ref = speak.remote(1.5, 'late-output')")
    k.wait_done(cell_a)
    area = k.log_area(cell_a)
    assert area is not None, "a cell that submitted work gets a log area, displayed under it"
    assert k.widget_state(area).get("lines") in (None, [])  # nothing printed yet
    cell_b = k.submit("import time; time.sleep(4)")
    k.wait_for(lambda: k.busy(cell_b), what="cell B to start")

    def late_line() -> bool:
        return any("late-output" in line[4] for line in k.widget_state(area).get("lines", []))

    k.wait_for(late_line, what="the late output in cell A's area")
    assert not k.idle(cell_b), "the late output must arrive while cell B still runs"
    lines = k.widget_state(area)["lines"]
    (line,) = [ln for ln in lines if "late-output" in ln[4]]
    _seq, source, kind, level, text = line
    assert (source, kind, level) == ("speak", "task", "stdout")
    assert re.fullmatch(r"\(speak pid=\d+\) late-output\n", text)
    assert k.widget_state(area)["sources"] == [["speak", "task"]]
    k.wait_done(cell_b)
    assert "late-output" not in k.stream_text(), "the output went to a stream too"
    assert k.log_area(cell_b) is None, "a cell that submitted nothing gets no area"


def test_output_as_streams_goes_to_the_submitting_cell(kernel):
    """``%cluster output stream``: task output as plain stream messages under its cell."""
    k = kernel()
    # One CPU: both tasks run on the same leased worker, whose stream the driver set up
    # while the warm-up cell ran (so "the context the reply arrives in" is not cell A).
    k.start_cluster("--num-cpus 1")
    k.run("%cluster output stream")
    k.run(SPEAK)
    warm = k.submit("warm_ref = speak.remote(1.0, 'warm-output')")
    # Cell A submits a task that prints after A has finished; cell B is running by then.
    cell_a = k.submit("late_ref = speak.remote(1.5, 'late-output')")
    cell_b = k.submit("import time; time.sleep(4)")
    k.wait_done(cell_b)
    k.wait_for(lambda: "late-output" in k.stream_text(), what="the task's output")
    for word, cell in (("warm-output", warm), ("late-output", cell_a)):
        msgs = [m for m in k.streams() if word in m["content"]["text"]]
        assert len(msgs) == 1, msgs
        assert msgs[0]["parent_header"]["msg_id"] == cell, word
        assert msgs[0]["content"]["name"] == "stdout"
        assert re.fullmatch(rf"\(speak pid=\d+\) {word}\n", msgs[0]["content"]["text"])
    assert "output" not in k.stream_text(cell_b)
    assert k.log_area(cell_a) is None


FLOOD = """
import logging
import nbcluster

@nbcluster.remote
def flood(n):
    for i in range(n):
        print("line", i)
    logging.getLogger("flood").warning("flood done")
    return n

assert nbcluster.get(flood.remote(100_000)) == 100_000
"""


def test_output_flood_is_folded_and_bounded(kernel):
    """(b) 100,000 lines: the area keeps the last few hundred, counts the rest as folded,
    and reaches the front end in a bounded number of messages."""
    k = kernel()
    k.start_cluster()
    cell = k.run(FLOOD, timeout=120)
    area = k.log_area(cell)
    assert area is not None
    k.wait_for(
        lambda: any("flood done" in ln[4] for ln in k.widget_state(area).get("lines", [])),
        what="the warning at the end",
    )
    state = k.widget_state(area)
    assert 0 < len(state["lines"]) <= 400
    assert state["folded"] > 0 and state["total"] == 100_001
    assert state["total"] - state["folded"] == len(state["lines"])
    warning = [ln for ln in state["lines"] if "flood done" in ln[4]]
    assert [ln[3] for ln in warning] == ["WARNING"]
    assert 0 < len(k.comm_updates(area)) < 200
    assert "line " not in k.stream_text(cell)


INTERRUPTED = """
import time
import nbcluster

@nbcluster.remote
def slow(s):
    print("slow started", flush=True)
    time.sleep(s)
    return s

@nbcluster.remote
def f(x):
    return x + 1
"""


def test_interrupt_cancels_the_cells_tasks_and_cluster_stays_usable(kernel):
    k = kernel()
    k.start_cluster()
    k.run(INTERRUPTED)
    cell = k.submit("nbcluster.get(slow.remote(60))")
    # The task runs (its output reached the cell), so the cell waits in get().
    k.wait_for(lambda: "slow started" in k.task_output(cell), what="the task to start")
    k.km.interrupt_kernel()
    reply = k.wait_done(cell, timeout=15)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert "cancelled 1 task(s) submitted by this cell" in k.stream_text(cell)
    # The kernel and the cluster are still usable, and nothing of that cell is left.
    k.run("assert nbcluster.get(f.remote(1)) == 2")
    k.run(
        "from nbcluster.testing import poll_for\n"
        "poll_for(lambda: len(nbcluster.state.pending_tasks()) == 0, timeout=15)\n"
        "from nbcluster.testing import assert_cluster_healthy\n"
        "assert_cluster_healthy(timeout=30)"
    )


def test_interrupt_with_keep_policy_leaves_tasks_running(kernel):
    k = kernel()
    k.start_cluster("--num-cpus 2 --on-interrupt keep")
    k.run(INTERRUPTED)
    cell = k.submit("ref = slow.remote(10); nbcluster.get(ref)")
    k.wait_for(lambda: "slow started" in k.task_output(cell), what="the task to start")
    k.km.interrupt_kernel()
    reply = k.wait_done(cell, timeout=15)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert "1 task(s) submitted by this cell keep running" in k.stream_text(cell)
    k.run("assert nbcluster.get(ref, timeout=60) == 10")


BUSY = """
import time
import nbcluster

@nbcluster.remote
def g(x):
    return x * 2

@nbcluster.remote
def sleeper():
    time.sleep(60)

@nbcluster.remote
class Pinger:
    def ping(self):
        return "pong"

assert nbcluster.get(g.remote(21)) == 42
in_flight = [sleeper.remote() for _ in range(1000)]
actors = [Pinger.remote() for _ in range(10)]
assert nbcluster.get([a.ping.remote() for a in actors], timeout=120) == ["pong"] * 10
"""


def test_cluster_dies_with_a_killed_kernel_and_a_new_kernel_can_start_one(kernel):
    k = kernel()
    session_dir = k.start_cluster()
    # J01: 1,000 tasks in flight (2 running, the rest queued) and 10 actors alive.
    k.run(BUSY, timeout=180)
    assert len(cluster_processes(session_dir)) >= 12, "head, node, workers and actors"
    kill_process(k.pid, signal.SIGKILL)
    assert_no_processes(session_dir, timeout=10)

    k2 = kernel()
    session_2 = k2.start_cluster()
    assert session_2 != session_dir
    k2.run(
        "import nbcluster\n"
        "@nbcluster.remote\n"
        "def seven():\n"
        "    return 7\n"
        "assert nbcluster.get(seven.remote()) == 7\n"
        "%cluster start\n"
        "assert nbcluster.get(seven.remote()) == 7\n"
    )


def test_cluster_dies_on_kernel_restart(kernel):
    k = kernel()
    session_dir = k.start_cluster()
    k.km.restart_kernel(now=True)
    k.client.wait_for_ready(timeout=180)
    assert_no_processes(session_dir, timeout=10)
    session_2 = k.start_cluster()
    assert session_2 != session_dir
    k.run("import nbcluster; assert nbcluster.get(nbcluster.put(5)) == 5")


def test_a_notebook_file_carries_its_cluster_to_a_new_kernel(kernel, tmp_path):
    """As in CI or Binder: the kernel of a saved notebook (``JPY_SESSION_NAME``, which
    jupyter_server sets and nbclient users pass) starts the cluster its metadata records."""
    import json

    record = {"version": 1, "cluster": {"num_cpus": 1, "nodes": 2}}
    nb = tmp_path / "carried.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {"nbcluster": record}, "nbformat": 4}))
    k = kernel(env={"JPY_SESSION_NAME": str(nb)})
    cell = k.run("%load_ext nbcluster\n%cluster start")
    k.wait_for(lambda: "recorded in" in k.stream_text(cell), what="the recreation message")
    assert (
        "nbcluster: starting the cluster recorded in the metadata of carried.ipynb: "
        "--num-cpus 1 --nodes 2"
    ) in k.stream_text(cell)
    # The start is recorded again, for the front end to store.
    records = [
        m["content"]["data"]["application/vnd.nbcluster.notebook-metadata+json"]
        for m in k.messages
        if m["msg_type"] == "display_data"
        and m["parent_header"].get("msg_id") == cell
        and "application/vnd.nbcluster.notebook-metadata+json" in m["content"]["data"]
    ]
    assert [r["cluster"] for r in records] == [{"num_cpus": 1, "nodes": 2}]
    k.session_dirs.append(
        k.eval_text("__import__('nbcluster').state.session_info()['session_dir']")
    )
    assert k.eval_text("len(__import__('nbcluster').state.node_stats())") == "2"
