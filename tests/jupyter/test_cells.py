"""Issue 13 in a real kernel: cells own their work, and code versions.

- a second interrupt of the same cell force-kills the workers the first one could not
  stop politely;
- re-running a cell cancels the pending tasks of its previous run whose results are no
  longer referenced (and leaves those still held), unless ``%cluster rerun keep``;
- the Timeline filters by the cell that submitted the tasks, with a cell picker that lists
  the cells live;
- redefining an actor class warns once about the actors still on the old code, and
  ``%cluster restart-actors`` remakes them on the new code; a redefined function runs its
  new code on a warm worker; ``%autoreload`` of a module reaches the workers.
"""

from __future__ import annotations

import textwrap

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STUBBORN = """
import time
import nbcluster

@nbcluster.remote
def stubborn():
    print("stubborn started", flush=True)
    while True:
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            print("ignoring the interrupt", flush=True)
"""


def test_second_interrupt_force_kills_what_the_first_could_not_stop(kernel):
    k = kernel()
    k.start_cluster("--num-cpus 1")
    k.run(STUBBORN)
    cell = k.submit("ref = stubborn.remote(); nbcluster.get(ref)")
    k.wait_for(lambda: "stubborn started" in k.task_output(cell), what="the task to start")
    k.km.interrupt_kernel()
    k.wait_for(lambda: "ignoring the interrupt" in k.task_output(cell), what="the polite cancel")
    k.wait_for(
        lambda: "interrupt again to force-kill their workers" in k.stream_text(cell),
        what="the hint",
    )
    assert not k.idle(cell), "the cell waits for its cancelled tasks"
    k.km.interrupt_kernel()
    reply = k.wait_done(cell, timeout=30)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    text = k.stream_text(cell)
    assert "cancelled 1 task(s) submitted by this cell" in text
    assert "interrupted again; force-killed the workers of 1 task(s)" in text
    k.run(
        "from nbcluster.testing import poll_for, assert_cluster_healthy\n"
        "poll_for(lambda: not nbcluster.state.pending_tasks(), timeout=30)\n"
        "try:\n"
        "    nbcluster.get(ref, timeout=30)\n"
        "    raise AssertionError('the task finished')\n"
        "except (nbcluster.exceptions.TaskCancelledError,"
        " nbcluster.exceptions.WorkerCrashedError):\n"
        "    pass\n"
        "assert_cluster_healthy(timeout=30)"
    )


SLEEPER = """
import time
import nbcluster

@nbcluster.remote
def sleeper(s):
    time.sleep(s)
    return s
"""


def test_rerunning_a_cell_cancels_its_unreferenced_pending_work(kernel):
    k = kernel()
    k.start_cluster("--num-cpus 1")
    k.run(SLEEPER)
    k.run("refs = [sleeper.remote(30) for _ in range(3)]", cell_id="cell-a")
    k.run("held = [sleeper.remote(30)]\nkept = held", cell_id="cell-b")
    assert k.eval_text("len(nbcluster.state.pending_tasks())") == "4"
    # Re-running cell A: its previous refs are replaced, so that run's 3 tasks go.
    rerun = k.run("refs = [sleeper.remote(30) for _ in range(3)]", cell_id="cell-a")
    assert "cancelled 3 pending task(s) of this cell's previous run" in k.stream_text(rerun)
    # Re-running cell B: `kept` still holds the previous result, so nothing is cancelled.
    rerun_b = k.run("held = [sleeper.remote(30)]", cell_id="cell-b")
    assert "cancelled" not in k.stream_text(rerun_b)
    k.run(
        "from nbcluster.testing import poll_for\n"
        "poll_for(lambda: len(nbcluster.state.pending_tasks()) == 5, timeout=30)"
    )
    # With the option off, a re-run leaves the previous run alone.
    k.run("%cluster rerun keep")
    again = k.run("refs = [sleeper.remote(30) for _ in range(3)]", cell_id="cell-a")
    assert "cancelled" not in k.stream_text(again)
    assert k.eval_text("len(nbcluster.state.pending_tasks())") == "8"


def test_timeline_filters_by_cell(kernel):
    k = kernel()
    k.start_cluster("--num-cpus 2")
    k.run(
        "import nbcluster\n"
        "@nbcluster.remote\n"
        "def square(x):\n"
        "    return x * x\n"
        "@nbcluster.remote\n"
        "def cube(x):\n"
        "    return x ** 3",
        store_history=True,
    )
    k.run("squares = nbcluster.get([square.remote(i) for i in range(5)])", store_history=True)
    first = int(k.eval_text("len(In) - 1"))  # In[] of the cell that ran last
    k.run("cubes = nbcluster.get([cube.remote(i) for i in range(3)])", store_history=True)
    k.run(
        "from nbcluster.jupyter.widgets import Timeline\n"
        "from nbcluster.jupyter.widgets._feed import Feed\n"
        "from nbcluster.testing import poll_for\n"
        "feed = Feed(autostart=False)\n"
        f"only = Timeline(cell={first}, feed=feed)\n"
        "every = Timeline(feed=feed)\n"
        "def seen():\n"
        "    feed.poll_once()\n"
        "    return every.summary.get('cube') and every.summary['cube'].count == 3\n"
        "poll_for(seen, timeout=30)\n"
        "assert {n: s.count for n, s in only.summary.items()} == {'square': 5}, only.summary\n"
        "assert every.summary['square'].count == 5"
    )
    # The cell picker lists the cells that submitted work, and choosing one redraws.
    labels = k.eval_text("[label for label, _ in every.cell_picker.options]")
    assert labels == str(["all cells", f"In [{first}]", f"In [{first + 1}]"])
    k.run(
        f"every.cell_picker.value = {first + 1}\n"
        f"assert every.cell == {first + 1}\n"
        "assert {n: s.count for n, s in every.summary.items()} == {'cube': 3}\n"
        "assert sorted(t.name for t in every.figure.data) == ['cube']\n"
        "assert sum(len(t.x) for t in every.figure.data) == 3\n"
        f"assert 'of In [{first + 1}]' in every.figure.layout.title.text\n"
        "every.cell = None\n"
        "assert every.cell_picker.value == 0 and every.total == 8"
    )
    # Live: a cell that submits work while the timeline is shown is listed when it ends,
    # also when its tasks' events arrived while it still ran.
    k.run(
        "more = nbcluster.get([square.remote(i) for i in range(4)])\n"
        "def seen_more():\n"
        "    feed.poll_once()\n"
        "    return every.total == 12\n"
        "poll_for(seen_more, timeout=30)\n"
        "assert len(In) - 1 not in every.cells  # its In [n] is known when it ends",
        store_history=True,
    )
    third = int(k.eval_text("len(In) - 1"))
    assert k.eval_text("every.cells") == str([first, first + 1, third])
    labels = k.eval_text("[label for label, _ in every.cell_picker.options]")
    assert labels.endswith(f"'In [{third}]']")
    k.run(
        f"every.cell = {third}\n"
        "assert {n: s.count for n, s in every.summary.items()} == {'square': 4}\n"
        f"assert every.cell_picker.value == {third}\n"
        "only.close(); every.close()"
    )


ACTOR_V1 = """
import nbcluster

@nbcluster.remote
class Counter:
    def __init__(self, start):
        self.n = start
    def get(self):
        return ("v1", self.n)
"""

MAKE_ACTORS = """
c = Counter.remote(5)
pool = [Counter.remote(1)]
assert nbcluster.get(c.get.remote()) == ("v1", 5)
"""

ACTOR_V2 = """
@nbcluster.remote
class Counter:
    def __init__(self, start):
        self.n = start
    def get(self):
        return ("v2", self.n)
"""


def test_a_redefined_actor_class_warns_once_and_its_actors_restart(kernel):
    k = kernel()
    k.start_cluster("--num-cpus 2")
    k.run(ACTOR_V1)
    k.run(MAKE_ACTORS)
    same = k.run(ACTOR_V1)  # the same cell again: the same code, no new version
    assert "changed" not in k.stream_text(same)
    cell = k.run(ACTOR_V2)
    text = k.stream_text(cell)
    assert text.count("changed") == 1
    assert (
        "nbcluster: Counter changed, but 2 actor(s) still run the old code: c, pool[0]. Run "
        "%cluster restart-actors to restart them on the new code"
    ) in text
    quiet = k.run("x = 1")
    assert "changed" not in k.stream_text(quiet), "the warning comes once"
    restart = k.run("%cluster restart-actors")
    assert "nbcluster: restarted c, pool[0] on the new code" in k.stream_text(restart)
    assert k.eval_text("nbcluster.get(c.get.remote())") == "('v2', 5)"
    assert k.eval_text("nbcluster.get(pool[0].get.remote())") == "('v2', 1)"


def test_redefined_functions_and_autoreloaded_modules_reach_warm_workers(kernel, tmp_path):
    k = kernel()
    k.start_cluster("--num-cpus 1")  # one worker: every task runs in the same warm process
    k.run(
        "import nbcluster\n"
        "@nbcluster.remote\n"
        "def f():\n"
        "    return 1\n"
        "v1 = nbcluster.state.code_version(f)\n"
        "assert nbcluster.get(f.remote()) == 1"
    )
    k.run(
        "@nbcluster.remote\n"
        "def f():\n"
        "    return 2\n"
        "assert nbcluster.state.code_version(f) != v1\n"
        "assert nbcluster.get(f.remote()) == 2"
    )
    module = tmp_path / "helper_mod.py"
    module.write_text("def value():\n    return 'first'\n")
    k.run(
        f"import os, sys\nos.chdir({str(tmp_path)!r})\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "%load_ext autoreload\n%autoreload 2\nimport helper_mod\n"
        "@nbcluster.remote\n"
        "def use():\n"
        "    return helper_mod.value()\n"
    )
    assert k.eval_text("nbcluster.get(use.remote())") == "first"
    module.write_text(textwrap.dedent("def value():\n    return 'second'\n"))
    import os
    import time

    later = time.time() + 5
    os.utime(module, (later, later))  # a new mtime, as an editor's save gives it
    assert k.eval_text("helper_mod.value()") == "second"  # the kernel reloaded it
    assert k.eval_text("nbcluster.get(use.remote())") == "second"  # and so did the worker
