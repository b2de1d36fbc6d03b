"""The tutorials in ``notebooks/``: committed clean, and executed with checks on what they print.

Two groups of tests:

- **clean** (fast, no kernel): every committed notebook is valid, has no outputs, no
  execution counts and no widget state; it starts with ``%load_ext nbcluster`` and
  ``%cluster start`` and ends with ``%cluster stop``; its ``check-...`` cell tags and the
  :data:`CHECKS` below match one for one; ``notebooks/README.md`` indexes it.
- **executed** (one real kernel per notebook, like a user running it top to bottom): nbclient
  runs the notebook with the ``python3`` kernel in ``notebooks/`` (120 s per cell, no widget
  state stored), every cell tagged ``check-...`` must produce text matching its checks, cells
  tagged ``raises-exception`` must actually raise, and no other cell may. The run time is
  asserted (issue 8 asks for under 60 s on 2 CPUs; the assert allows 90 s for slow CI
  machines) and listed at the end of the pytest output. Afterwards no process of the
  notebook's cluster may be left.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

from nbcluster.testing import assert_no_processes

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"

#: The tutorials, in order (issue 8, acceptance 1).
EXPECTED = [
    "01_quickstart",
    "02_actors",
    "03_batch_prediction",
    "04_objects_and_memory",
    "05_dags",
    "06_placement_groups_and_scheduling",
    "07_fault_tolerance",
    "08_multi_node",
    "09_data",
    "10_train",
    "11_tune",
    "12_serve",
    "13_jobs",
    "14_autoscaling",
]

#: A run longer than this fails (the acceptance bound is 60 s; slack for slow CI machines).
MAX_SECONDS = 90.0
#: Per-cell timeout given to nbclient.
CELL_TIMEOUT_S = 120

Check = str | Callable[[str], None]


def _calls_per_actor(text: str) -> None:
    m = re.search(r"calls per actor: \[(\d+), (\d+)\]", text)
    assert m, text
    assert int(m[1]) + int(m[2]) == 8, text


def _by_value_costs_more(text: str) -> None:
    m = re.search(r"^spent (-?\d+) ms more submitting the calls$", text, re.MULTILINE)
    assert m, text
    # 16 copies of 8.5 MB serialized and stored by the driver: tens of ms at the very least.
    assert int(m[1]) > 0, text


def _freed(text: str) -> None:
    m = re.search(r"object store use: (\d+) MB before, (\d+) MB after", text)
    assert m, text
    assert int(m[1]) >= 120, text  # the 80 MB array and the 40 MB task result
    assert int(m[2]) == 0, text


STARTED = r"nbcluster at \S+ \(started by this kernel\)"
STOPPED = r"nbcluster: stopped the cluster at \S+"
WIDGET = r"application/vnd\.jupyter\.widget-view\+json"

#: notebook -> cell tag -> checks on the cell's text: a regex that must be found
#: (``re.search``, MULTILINE), or a callable that asserts.
CHECKS: dict[str, dict[str, list[Check]]] = {
    "01_quickstart": {
        "check-start": [STARTED, r"nodes: 1 \| CPUs used: 0 / 2"],
        "check-get": [r"^16$"],
        "check-sum": [r"^sum of squares: 332833500$"],
        "check-put": [
            r"^sum computed by 4 tasks: 499999500000\.0$",
            r"^sum computed here: +499999500000\.0$",
        ],
        "check-wait": [r"^2 ready: \[0\.1, 0\.2\]; 1 still running$"],
        "check-error": [
            r"ename: .*ZeroDivisionError",
            r"divide raised an exception \(pid=\d+",
            r"in divide",
            r"ZeroDivisionError: division by zero",
        ],
        "check-catch": [
            r"^caught a TaskError\(ZeroDivisionError\)$",
            r"^raised by divide in worker pid \d+ on \S+$",
            r"^original exception: ZeroDivisionError\('division by zero'\)$",
        ],
        "check-timeline-widget": [WIDGET, r"Timeline"],
        "check-resources-widget": [WIDGET, r"Resources"],
        "check-timeline": [
            r"^Timeline: [\d,]+ attempts on \d+ workers?",
            r"^  work: \d+ attempts?",
        ],
        "check-display": [r"^squares: \[0, 1, 4\]$"],
        "check-stop": [STOPPED],
    },
    "02_actors": {
        "check-start": [STARTED],
        "check-counter": [r"^after each call: \[1, 2, 3, 4, 5, 6, 7, 8, 9, 10\]$", r"^count: 10$"],
        "check-shared": [r"^count: 20$"],
        "check-named": [r"^scores: 110$"],
        "check-get-if-exists": [r"^same actor, same state: 110$"],
        "check-pool": [
            r"^primes per range: \[669, 560, 525, 508, 500, 483, 487, 471\]$",
            r"^primes below 40,000: 4203$",
            _calls_per_actor,
        ],
        "check-kill": [r"^the call failed with ActorDiedError$"],
        "check-stop": [STOPPED],
    },
    "03_batch_prediction": {
        "check-start": [STARTED],
        "check-data": [r"^16 shards of 128 rows x 64 features, [\d.]+ MB of Parquet$"],
        "check-model": [r"^model: 8\.5 MB, stored once$"],
        "check-timeline-widget": [WIDGET],
        "check-tasks": [
            r"^tasks: 16 shards predicted in [\d.]+ s$",
            r"^predictions per shard: \(128,\) int64$",
        ],
        "check-pool": [
            r"^actor pool: 16 shards predicted in [\d.]+ s",
            r"^predictions per shard: \(128,\) int64$",
            r"^same predictions as the tasks: True$",
        ],
        "check-timeline": [
            r"^  predict_shard: 16 attempts",
            r"^  predict: \d+ attempts?",
            r"^wrote [1-9]\d* trace events to \S+trace\.json$",
        ],
        "check-by-value": [
            r"^by reference: submitted in \d+ ms, done in [\d.]+ s$",
            r"^by value: +submitted in \d+ ms, done in [\d.]+ s$",
            r"^by value, the driver stored 16 copies of the model \(136 MB\) and$",
            _by_value_costs_more,
            r"^same predictions either way: True$",
        ],
        "check-stop": [STOPPED],
    },
    "04_objects_and_memory": {
        "check-start": [STARTED],
        "check-put-get": [r"^put 80 MB in \d+ ms, got it back in [\d.]+ ms$"],
        "check-zero-copy": [
            r"^a and b share memory: True$",
            r"^a is writeable: False$",
            r"^equal to the original: True$",
        ],
        "check-read-only": [r"^ValueError: assignment destination is read-only$"],
        "check-tasks": [
            r"^8 tasks read the 80 MB array in \d+ ms$",
            r"^their mean matches the local mean: True$",
        ],
        "check-task-result": [r"^40 MB from a task, writeable: False, sum 5000000$"],
        "check-store-widget": [WIDGET, r"Object store"],
        "check-owned": [
            r"^[0-9a-f]{40} +80\.0 MB  ready, in store: True$",
            r"^[0-9a-f]{40} +40\.0 MB  ready, in store: True$",
        ],
        "check-free": [_freed, r"^objects this notebook still owns: 0$"],
        "check-stop": [STOPPED],
    },
    "05_dags": {
        "check-start": [STARTED],
        "check-draw": [r"<svg", r"DAG of 6 node\(s\)", r"combine\(n\d+, n\d+\)"],
        "check-print": [r"body=combine", r"body=square_all", r"<shown above>"],
        "check-execute": [
            r"^n = 10:  \{'sum': 45, 'sum of squares': 285\}$",
            r"^n = 100: \{'sum': 4950, 'sum of squares': 328350\}$",
        ],
        "check-multi": [r"^running totals and sum\(range\(y\)\): \[101, 111, 45\]$"],
        "check-dagview-widget": [WIDGET, r"DAGView: 10 tasks, 9 dependencies"],
        "check-dagview": [r"^grand total: 855$"],
        "check-stop": [STOPPED],
    },
    "06_placement_groups_and_scheduling": {
        "check-start": [STARTED],
        "check-resources": [r"^cluster: +2\.0 CPUs$", r"^available: 2\.0 CPUs$"],
        "check-pg": [
            r"^reserved: True$",
            r"^state: CREATED$",
            r"^task outside the group ran: False$",
        ],
        "check-in-group": [r"^bundle 0: node \w+, pid \d+$", r"^bundle 1: node \w+, pid \d+$"],
        "check-removed": [r"^the waiting task: outside the group$", r"^available: 2\.0 CPUs$"],
        "check-pending": [
            r"^placed within 1 s: False$",
            r"^state: PENDING$",
            r"^why: infeasible",
        ],
        "check-scale": [r"nodes: 2 \| CPUs used: [\d.]+ / 4"],
        "check-spread-pg": [
            r"^placed: True$",
            r"^state: CREATED$",
            r"^the two bundles are on 2 different nodes$",
        ],
        "check-strategies": [
            r"^SPREAD used 2 nodes$",
            r"^pinned task ran on the chosen node: True$",
        ],
        "check-stop": [STOPPED],
    },
    "07_fault_tolerance": {
        "check-start": [STARTED],
        "check-retry": [
            r"^first attempt: pid \d+, killed$",
            r"^retry: pid \d+, finished$",
            r"^the retry ran in another process: True$",
        ],
        "check-no-retry": [r"^WorkerCrashedError: .*killed by SIGKILL"],
        "check-actor": [r"^counts: \[1, 2, 3\]$", r"^actor pid: \d+$"],
        "check-crash": [r"^the crashing call failed with ActorDiedError$"],
        "check-restarted": [r"^restarted in a new process: True$", r"^count after restart: 1$"],
        "check-dead": [r"^after the second crash the actor is dead for good$"],
        "check-stop": [STOPPED],
    },
    "08_multi_node": {
        "check-start": [STARTED, r"nodes: 3 \| CPUs used: 0 / 3"],
        "check-nodes": [
            r"^node0: alive=True, CPUs=1, address=\S+:\d+$",
            r"^node1: alive=True, CPUs=1, address=\S+:\d+$",
            r"^node2: alive=True, CPUs=1, address=\S+:\d+$",
            r"^this driver is attached to node[012]$",
        ],
        "check-spread": [r"^SPREAD: \{'node0': 2, 'node1': 2, 'node2': 2\}$"],
        "check-affinity": [r"^pinned to node2, ran on: node2$"],
        "check-transfer": [r"^made on node1, summed on node2: 5000000$"],
        "check-stores": [
            r"^node0: +0\.0 MB in the object store$",
            r"^node1: +20\.0 MB in the object store$",
            r"^node2: +20\.0 MB in the object store$",
        ],
        "check-scale": [r"nodes: 4 \| CPUs used: [\d.]+ / 4"],
        "check-scaled": [
            r"^alive nodes: 4$",
            r"^SPREAD: \{'node0': 2, 'node1': 2, 'node2': 2, 'node3': 2\}$",
        ],
        "check-stop": [STOPPED],
    },
    "09_data": {
        "check-start": [STARTED],
        "check-data": [r"^8 files, 200,000 rows$"],
        "check-lazy": [
            r"^200,000 rows, read from metadata only: True$",
            r"Dataset\(num_rows=200000, schema=\{id: int64, city: int64, f0: double",
        ],
        "check-plan": [
            r"^ReadParquet -> Filter\(id >= 150000\) -> Project\(id, city, f0, f1\) -> "
            r"MapBatches\(standardize\)$",
            r"^ReadParquet\[columns=id,city,f0,f1; filter=\(id >= 150000\)\] -> "
            r"MapBatches\(standardize\)$",
            r"^0: ReadParquet\[.*\]->MapBatches\(standardize\) \[source\]$",
        ],
        "check-preview": [
            r"^0\. ReadParquet\[columns=id,city,f0,f1; filter=\(id >= 150000\)\] -> 5000 rows; "
            r"id: int64, city: int64, f0: double, f1: double$",
            r"^1\. MapBatches\(standardize\) -> 5000 rows; id: int64, city: int64, x0: double, "
            r"x1: double$",
        ],
        "check-progress": [WIDGET, r"\(live progress\): ReadParquet.*->MapBatches\(Model\)$"],
        "check-predictions": [
            r"^predicted 50,000 rows in 10 blocks$",
            r"^model instances used: [12] \(at most 2\)$",
        ],
        "check-stats": [
            r"^Operator 0 ReadParquet.*->MapBatches\(standardize\)->MapBatches\(Model\): 10 "
            r"tasks executed",
            r"^\* Object store budget: [\d.]+ GiB; peak bytes in flight: [\d.]+ \w+$",
            r"^\* Spilled to disk during the execution: 0 B$",
        ],
        "check-groupby": [r"^same as pandas: True$"],
        "check-torch": [
            r"^5 batches; first: \{'label': \(10000,\), 'city': \(10000,\)\}, "
            r"dtype torch\.float32$"
        ],
        "check-plan-view": [
            WIDGET,
            r"^  0 \[done\] ReadParquet\[.*\]->MapBatches\(standardize\): 50k rows",
        ],
        "check-stop": [STOPPED],
    },
    "10_train": {
        "check-start": [STARTED],
        "check-data": [r"^2048 training and 512 test images of shape \(1, 28, 28\)$"],
        "check-fit": [
            WIDGET,
            # an accuracy of exactly 1 is shown as "1"
            r"TorchTrainer fashion: FINISHED, iteration 6, loss=[\d.]+, accuracy=(1|[01]\.\d+),",
            r"\[rank 0\] epoch 5: accuracy [01]\.\d\d$",
        ],
        "check-result": [
            r"^accuracy after 6 epochs: (0\.[6-9]\d|1\.00)$",
            r"^best by accuracy: checkpoint_00000[0-5]$",
            r"^checkpoints kept: \[('checkpoint_00000[0-5]', ){1,2}'checkpoint_000005'\]$",
        ],
        "check-repr": [r"Training result", r"finished", r"checkpoint_000005"],
        "check-interrupt": [
            WIDGET,
            r"TorchTrainer fashion-long: INTERRUPTED",
            r"^interrupted: True$",
            r"^reports before the interrupt: [3-8]$",
            r"^latest checkpoint: checkpoint_00000[2-7] \(epoch [2-7]\)$",
        ],
        "check-resume": [
            r"^resumed from: checkpoint_00000[2-7]$",
            r"^epochs this run: \[(\d, )*8\]$",
            r"^first epoch of this run is the one after the checkpoint: True$",
            r": FINISHED, ",
        ],
        "check-warm": [
            r"^first report \(one epoch\) after \d+ ms on new workers, \d+ ms on the warm ones$",
            r"^same worker processes as before: True$",
        ],
        "check-stop": [STOPPED],
    },
    "11_tune": {
        "check-start": [STARTED],
        "check-search": [
            WIDGET,
            r"^8 trials, 8 terminated, 0 errors$",
            r"^best: lr=0\.\d{4}, momentum=0\.\d\d, loss=\d\.\d{4}$",
        ],
        "check-grid": [r"ResultGrid: 8 trials", r"8 TERMINATED", r"config/|lr"],
        "check-frame": [
            r"^8 rows, one per trial$",
            r"config/lr",
            r"^best trial's history: 20 results$",
        ],
        "check-more": [WIDGET, r"^12 trials now, 12 terminated$", r"^the first 8 unchanged: True$"],
        "check-asha": [
            WIDGET,
            r"^stopped early: ([1-9]|1[0-5]) of 16 trials$",
            r"^epochs run: \d+ instead of 320$",
            r"^best loss: \d\.\d{4}$",
        ],
        "check-interrupt": [
            WIDGET,
            r"Interrupted\. Finished trials are in the returned ResultGrid",
            r"^stopped: interrupted$",
            r"^results so far: \d+$",
        ],
        "check-restore": [
            WIDGET,
            r"^can restore: True$",
            r"^4 of 4 trials finished$",
            r"^trials that started over: 0$",
        ],
        "check-detached": [r"^controller running: True$"],
        "check-attach": [
            WIDGET,
            r"^4 of 4 trials finished$",
            r"^controller running: False$",
        ],
        "check-detached-stop": [
            WIDGET,
            r"Stopped watching; the detached run goes on",
            r"^run: STOPPED, trials: 2, finished: 0$",
            r"^controller running: False$",
            r"^can restore: True$",
        ],
        "check-stop": [STOPPED],
    },
    "12_serve": {
        "check-start": [STARTED],
        "check-train": [r"^training accuracy: 0\.9\d$"],
        "check-run": [
            r"^Application 'iris' is ready at http://127\.0\.0\.1:\d+/iris$",
            r"through the Jupyter server: /\S*nbcluster/api/clusters/[0-9a-f]{12}/serve/iris$",
            WIDGET,
        ],
        "check-call": [
            r"^handle prediction: setosa$",
            r"^http status: 200$",
            r"^http prediction: virginica$",
        ],
        "check-batch": [
            r"^answered 64 requests in \d+ batches$",
            r"^largest batch > 1: True$",
            r"^same labels as the model: True$",
        ],
        "check-autoscale-up": [r"^replicas before the load: 1$", r"^replicas under load: 3$"],
        "check-autoscale-down": [r"^replicas after the load: 1$"],
        "check-rollout": [
            r"^rolled over in \d+\.\d s$",
            r"^requests during the rollout: [1-9]\d*, failed: 0$",
            r"^new version answers: True$",
        ],
        "check-status": [r"^iris RUNNING ", r"^applications after shutdown: \{\}$"],
        "check-stop": [STOPPED],
    },
    "13_jobs": {
        "check-start": [STARTED],
        "check-submit": [r"^submitted: True$"],
        "check-logs": [r"^epoch 0: loss 1\.0$", r"^epoch 2: loss 0\.333$", r"^training done$"],
        "check-status": [r"^status: SUCCEEDED$", r"^exit code: 0$", r"^took under a minute: True$"],
        "check-failed": [r"^FAILED$", r"^Job entrypoint command failed with exit code 1"],
        "check-magic": [r"^cluster CPUs seen by the job: 2\.0$", r"job nbcsubmit_\w+: SUCCEEDED"],
        "check-runtime-env": [r"^\[\('eval', 0\.25\), \('eval', 0\.1\)\]$"],
        "check-state": [
            r"^flaky: \{'FAILED': 1, 'FINISHED': 3\}$",
            r"^why: ValueError: x == 2 is not allowed",
            r"^jobs submitted: 3$",
        ],
        "check-stop": [STOPPED],
    },
    "14_autoscaling": {
        "check-start": [
            STARTED,
            r"^nbcluster: autoscaling up to 3 nodes; a node added under load leaves after 3s idle$",
        ],
        "check-autoscaler-widget": [WIDGET, r"Autoscaler"],
        "check-resources-widget": [WIDGET],
        "check-grow": [
            r"^the cluster grew to 3 nodes$",
            r"^the work ran on more than one node: True$",
        ],
        "check-events": [
            r"^ +launch: launching [12] x worker for \d+ x \{CPU: 1\} queued$",
            r"^ +joined: node local-worker-[0-9a-f]{6} \(worker\) joined after [\d.]+s$",
        ],
        "check-shrink": [
            r"^back to 1 node$",
            r"^removed 2 nodes, for example: idle for \d+s \(idle timeout 3s\)$",
        ],
        "check-request": [r"^nodes after request_resources\(num_cpus=3\): 3$"],
        "check-infeasible": [
            r"^\d+ request\(s\) for \{CPU: 1, GPU: 1\}: no node type can ever hold "
            r"\{CPU: 1, GPU: 1\} \(node types: worker \{CPU: 1\}\)",
        ],
        "check-summary": [r"^autoscaler \(local\): \d+ running, \d+ launching, max 2; \d+ queued"],
        "check-stop": [STOPPED],
    },
}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _path(name: str) -> Path:
    return NOTEBOOKS / f"{name}.ipynb"


def _read(name: str) -> Any:
    return nbformat.read(_path(name), as_version=nbformat.NO_CONVERT)


def _code_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code"]


def _tags(cell: Any) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def cell_text(cell: Any) -> str:
    """Everything a cell showed, as text: streams, text/* data (and the names of the other
    mimetypes) of results and displays, and errors (name, value, traceback; ANSI removed)."""
    parts: list[str] = []
    last_stream = None
    last_at = -1  # where in ``parts`` the last stream's text is
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            text = text if isinstance(text, str) else "".join(text)
            # Consecutive chunks of one stream read as one text, as the notebook shows them:
            # one print() may arrive as several stream messages under load.
            if last_stream == out.get("name") and last_at >= 0:
                parts[last_at] += text
            else:
                parts.append(text)
                last_at = len(parts) - 1
            last_stream = out.get("name")
            continue
        data = out.get("data", {}) if kind in ("execute_result", "display_data") else {}
        if (
            kind == "display_data"
            and WIDGET_VIEW in data
            and set(data) <= {WIDGET_VIEW, "text/plain"}
        ):
            # A widget shown from another thread (the cell's log area opens at its work's
            # first output) may land between two chunks of one print(): they still join.
            parts.append("mimetypes: " + " ".join(sorted(data)))
            if "text/plain" in data:
                plain = data["text/plain"]
                parts.append(plain if isinstance(plain, str) else "".join(plain))
            continue
        last_stream = None
        if kind in ("execute_result", "display_data"):
            parts.append("mimetypes: " + " ".join(sorted(data)))
            for mime, value in data.items():
                if mime.startswith("text/"):
                    parts.append(value if isinstance(value, str) else "".join(value))
        elif kind == "error":
            parts.append(f"ename: {out.get('ename')}\nevalue: {out.get('evalue')}")
            parts.append("\n".join(out.get("traceback", [])))
    return _ANSI.sub("", "\n".join(parts))


def test_a_widget_shown_between_two_chunks_of_one_print_does_not_split_it() -> None:
    widget = {"output_type": "display_data", "data": {WIDGET_VIEW: {}, "text/plain": "Log"}}
    cell = {
        "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "scores:"},
            widget,
            {"output_type": "stream", "name": "stdout", "text": " 110\n"},
        ]
    }
    text = cell_text(cell)
    assert re.search(r"^scores: 110$", text, re.MULTILINE), text
    assert re.search(WIDGET, text) and "Log" in text
    # Any other display does end the stream's text (what comes after shows apart).
    cell["outputs"][1] = {"output_type": "display_data", "data": {"text/html": "<b>x</b>"}}
    assert not re.search(r"^scores: 110$", cell_text(cell), re.MULTILINE)


# -- committed notebooks are clean ---------------------------------------------------------


def test_the_tutorials_are_the_expected_ones():
    found = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == EXPECTED
    assert sorted(CHECKS) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_committed_notebook_is_clean(name):
    nb = _read(name)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert "widgets" not in nb.metadata, "widget state is stored in the notebook metadata"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    dirty = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i} has {len(cell.outputs)} output(s)")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i} has execution_count {cell.execution_count}")
        for key in ("execution", "widgets", "collapsed", "scrolled"):
            if key in cell.get("metadata", {}):
                dirty.append(f"cell {i} has metadata {key!r}")
    assert not dirty, f"{name}.ipynb is not clean (clear its outputs): {dirty}"


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_starts_and_stops_a_cluster(name):
    cells = _code_cells(_read(name))
    first = cells[0].source.splitlines()
    assert first[0] == "%load_ext nbcluster", first
    assert re.fullmatch(r"%cluster start( --\S+ \S+)*", first[1]), first
    assert len(first) == 2, first
    if name == "08_multi_node":
        assert "--nodes 3" in first[1]
    elif name == "14_autoscaling":
        assert "--max-nodes 3" in first[1]
    else:
        assert first[1] == "%cluster start --num-cpus 2"
    assert cells[-1].source.strip() == "%cluster stop"
    assert all("%cluster stop" not in c.source for c in cells[:-1])


@pytest.mark.parametrize("name", EXPECTED)
def test_check_tags_and_checks_match(name):
    tags = [t for c in _code_cells(_read(name)) for t in _tags(c) if t.startswith("check-")]
    assert len(tags) == len(set(tags)), f"a check tag is used twice: {tags}"
    assert sorted(tags) == sorted(CHECKS[name]), "tags in the notebook != CHECKS in this file"


def test_readme_indexes_every_tutorial():
    readme = (NOTEBOOKS / "README.md").read_text()
    for name in EXPECTED:
        assert f"({name}.ipynb)" in readme, name


def test_cell_text_and_checks_can_fail():
    """The checking machinery itself: a wrong value is caught."""
    cell = nbformat.v4.new_code_cell(
        "x",
        outputs=[nbformat.v4.new_output("stream", name="stdout", text="count: 19\n")],
    )
    text = cell_text(cell)
    assert re.search(r"^count: 19$", text, re.MULTILINE)
    with pytest.raises(AssertionError):
        _run_checks({"check-x": [r"^count: 20$"]}, {"check-x": text})
    with pytest.raises(AssertionError):
        _freed("object store use: 120 MB before, 80 MB after")
    with pytest.raises(AssertionError):
        _run_checks({"check-x": [r"."]}, {})  # a check whose cell is missing


def test_cell_text_reads_split_stream_chunks_as_the_notebook_shows_them():
    """One print() may arrive as several stream messages under load (a fresh-clone run failed
    02_actors' check-get-if-exists that way): consecutive chunks of a stream are one text."""
    out = nbformat.v4.new_output
    cell = nbformat.v4.new_code_cell(
        "x",
        outputs=[
            out("stream", name="stdout", text="same actor: "),
            out("stream", name="stdout", text="True\nnext line\n"),
            out("stream", name="stderr", text="warn\n"),
            out("stream", name="stdout", text="after\n"),
        ],
    )
    text = cell_text(cell)
    assert re.search(r"^same actor: True$", text, re.MULTILINE), text
    assert re.search(r"^next line$", text, re.MULTILINE), text
    assert re.search(r"^warn$", text, re.MULTILINE), text
    assert re.search(r"^after$", text, re.MULTILINE), text


# -- executed -------------------------------------------------------------------------------


def _run_checks(checks: dict[str, list[Check]], texts: dict[str, str]) -> None:
    failures = []
    for tag, cell_checks in checks.items():
        if tag not in texts:
            failures.append(f"{tag}: no cell has this tag")
            continue
        text = texts[tag]
        for check in cell_checks:
            if isinstance(check, str):
                if not re.search(check, text, re.MULTILINE):
                    failures.append(f"{tag}: {check!r} not found in:\n{text[-3000:]}")
            else:
                try:
                    check(text)
                except AssertionError as err:
                    failures.append(f"{tag}: {check.__name__} failed: {err}")
    assert not failures, "\n\n".join(failures)


def _execute(name: str) -> tuple[Any, float]:
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(_path(name), as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        store_widget_state=False,
    )
    start = time.monotonic()
    failure = ""
    try:
        client.execute()
    except CellExecutionError as err:
        failure = _ANSI.sub("", str(err))[-6000:]
    if failure:
        pytest.fail(f"{name}.ipynb failed in a cell:\n{failure}", pytrace=False)
    return nb, time.monotonic() - start


@pytest.mark.notebook
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_tutorial_runs_and_shows_what_it_should(
    name, tmp_path, monkeypatch, record_property, record_run_time
):
    # The kernel inherits this environment: its cluster's session goes under tmp_path.
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(tmp_path))
    nb, seconds = _execute(name)
    record_run_time(name, seconds)
    record_property("seconds", round(seconds, 1))

    cells = _code_cells(nb)
    raised = [c for c in cells if any(o.output_type == "error" for o in c.get("outputs", []))]
    expected_to_raise = [c for c in cells if "raises-exception" in _tags(c)]
    assert [c.id for c in raised] == [c.id for c in expected_to_raise], (
        "cells tagged raises-exception must raise, and no other cell may"
    )
    texts = {t: cell_text(c) for c in cells for t in _tags(c) if t.startswith("check-")}
    _run_checks(CHECKS[name], texts)

    assert "widgets" not in nb.metadata, "widget state was stored"
    sessions = sorted(tmp_path.glob("session_*"))
    assert sessions, f"{name} started no cluster under NBCLUSTER_TEMP_DIR={tmp_path}"
    for session in sessions:
        assert_no_processes(session, timeout=15)
    assert seconds < MAX_SECONDS, f"{name} took {seconds:.1f} s (the bound is 60 s)"


def test_notebooks_dir_holds_only_tutorials():
    """The kernels run in notebooks/ (as in JupyterLab): a run must leave no files there."""
    allowed = {".ipynb_checkpoints", "README.md"}
    leftovers = [p.name for p in NOTEBOOKS.iterdir() if p.suffix != ".ipynb"]
    assert not [n for n in leftovers if n not in allowed], leftovers
