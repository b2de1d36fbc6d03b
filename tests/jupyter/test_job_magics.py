"""``%%job`` and ``%job`` in an in-process IPython shell, against a real cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import nbcluster
from nbcluster import LocalCluster
from nbcluster.job_submission import JobStatus, JobSubmissionClient
from nbcluster.jupyter.job_magics import JobView
from nbcluster.testing import assert_no_processes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(num_cpus=2).start()
    yield c
    c.stop()
    assert c.session_dir is not None
    assert_no_processes(c.session_dir, timeout=15)


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    start_ipython()
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbcluster")
    yield shell


def test_cell_runs_as_a_job_with_the_kernels_working_directory(
    ip: Any, cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "local_helper.py").write_text("GREETING = 'hello from the notebook folder'\n")
    monkeypatch.chdir(tmp_path)
    cell = (
        "import local_helper, nbcluster\n"
        "nbcluster.init()\n"
        "print(local_helper.GREETING)\n"
        "print('sum', nbcluster.get(nbcluster.put(40)) + 2)\n"
    )
    result = ip.run_cell_magic(
        "job", f"--address {cluster.address} --wait --submission-id cell-1", cell
    )
    out = capsys.readouterr().out
    assert result is None
    assert "hello from the notebook folder" in out and "sum 42" in out
    assert "job cell-1: SUCCEEDED" in out
    client = JobSubmissionClient(cluster.address)
    assert client.get_job_info("cell-1").metadata["source"] == "%%job"
    client.close()


def test_attach_after_a_restart_shows_the_job_again(
    ip: Any, cluster: LocalCluster, capsys: Any
) -> None:
    view = ip.run_cell_magic(
        "job",
        f"--address {cluster.address} --no-working-dir",
        "import time\nprint('tick')\ntime.sleep(0.5)",
    )
    assert isinstance(view, JobView) and view.info.status in (JobStatus.PENDING, JobStatus.RUNNING)
    sid = view.submission_id
    # A "new kernel" only knows the id: attach prints the whole log and the outcome.
    ip.run_line_magic("job", f"attach {sid} --address {cluster.address} --wait")
    out = capsys.readouterr().out
    assert "tick" in out and f"job {sid}: SUCCEEDED" in out
    attached = ip.run_line_magic("job", f"attach {sid} --address {cluster.address}")
    assert isinstance(attached, JobView) and "SUCCEEDED" in repr(attached)
    assert "tick" in attached._repr_html_() or attached.info.status is JobStatus.SUCCEEDED


def test_the_live_view_follows_the_log_in_a_widget(ip: Any, cluster: LocalCluster) -> None:
    view = ip.run_cell_magic(
        "job",
        f"--address {cluster.address} --no-working-dir",
        "for i in range(3):\n    print('line', i)\n",
    )
    view._ipython_display_()  # what the front end does with the cell's result
    # The view's thread follows the log to its end, then shows the final status and
    # disables the button (after it stopped its status ticker): wait for all of it.
    assert view._thread is not None
    view._thread.join(timeout=60)
    assert not view._thread.is_alive(), "the live view still follows the job after 60 s"
    status, out, stop = view._widget
    assert "SUCCEEDED" in status.value and stop.disabled
    text = "".join(o.get("text", "") for o in out.outputs)
    assert "line 0" in text and "line 2" in text


def test_stop_and_bad_input_are_usage_errors(ip: Any, cluster: LocalCluster, capsys: Any) -> None:
    view = ip.run_cell_magic(
        "job", f"--address {cluster.address} --no-working-dir", "import time\ntime.sleep(60)"
    )
    ip.run_line_magic("job", f"stop {view.submission_id} --address {cluster.address}")
    assert "stop requested" in capsys.readouterr().out
    client = JobSubmissionClient(cluster.address)
    assert client.wait_until_finished(view.submission_id, timeout=30) is JobStatus.STOPPED
    client.close()
    with pytest.raises(UsageError, match=r"does not exist"):
        ip.run_line_magic("job", f"attach nope --address {cluster.address}")
    with pytest.raises(UsageError, match=r"give the job's submission id"):
        ip.run_line_magic("job", f"attach --address {cluster.address}")
    with pytest.raises(UsageError, match=r"--runtime-env-json is not JSON"):
        ip.run_cell_magic("job", f"--address {cluster.address} --runtime-env-json {{bad", "pass")
    with pytest.raises(UsageError, match=r"unrecognized arguments"):
        ip.run_cell_magic("job", "--colour red", "pass")
