"""``%cluster`` in an in-process IPython shell (``globalipapp``), against real clusters."""

from __future__ import annotations

import argparse
import base64
import builtins
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import nbcluster
from nbcluster import _api, state
from nbcluster.exceptions import TaskCancelledError
from nbcluster.jupyter import notebook_spec
from nbcluster.jupyter.display import ClusterView
from nbcluster.jupyter.magics import parse_size
from nbcluster.testing import assert_no_processes, cluster_processes, poll_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ip() -> Iterator[Any]:
    """The global in-process IPython shell with ``%load_ext nbcluster`` done."""
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    start_ipython()  # once per process; later calls return None
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbcluster")
    yield shell
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    shell.run_line_magic("unload_ext", "nbcluster")


@pytest.fixture
def magic(ip: Any) -> Iterator[Any]:
    """``magic("start --num-cpus 2")`` runs ``%cluster start --num-cpus 2``.

    Teardown stops whatever cluster is connected and checks that no process of any
    session this test started is left.
    """
    sessions: list[str] = []

    def run(line: str) -> Any:
        result = ip.run_line_magic("cluster", line)
        if state.is_connected():
            info = state.session_info()
            if info["started_here"] and info["session_dir"] not in sessions:
                sessions.append(info["session_dir"])
        return result

    yield run
    if nbcluster.is_initialized():
        ip.run_line_magic("cluster", "stop")
    for session_dir in sessions:
        assert_no_processes(session_dir, timeout=10)


def _sessions() -> list[Path]:
    return sorted(Path(os.environ["NBCLUSTER_TEMP_DIR"]).glob("session_*"))


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000", 1000),
        ("512MB", 512 * 10**6),
        ("512mb", 512 * 10**6),
        ("2GiB", 2 * 2**30),
        ("1.5KiB", 1536),
        ("10 kB", 10_000),
        ("3TB", 3 * 10**12),
        ("1G", 10**9),
    ],
)
def test_parse_size_accepts_bytes_and_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "12XB", "1e9", "2 GiB extra", "0x10"])
def test_parse_size_rejects_everything_else(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^invalid size .*: use bytes"):
        parse_size(text)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", r"the following arguments are required: COMMAND"),
        ("frobnicate", r"invalid choice: 'frobnicate'"),
        ("start --num-cpus -1", r"argument --num-cpus: expected a finite number >= 0"),
        ("start --num-cpus nan", r"argument --num-cpus: expected a finite number >= 0"),
        ("start --num-cpus two", r"argument --num-cpus: expected a number, got 'two'"),
        ("start --nodes 0", r"argument --nodes: expected at least 1, got 0"),
        ("start --object-store-memory lots", r"argument --object-store-memory: invalid size"),
        ("start --on-interrupt explode", r"argument --on-interrupt: invalid choice"),
        ("start --bogus", r"unrecognized arguments: --bogus"),
        ("connect", r"the following arguments are required: ADDRESS"),
        ("scale", r"the following arguments are required: N"),
        ("scale 1.5", r"argument N: expected a whole number, got '1.5'"),
        ("start --num-cpus 'unbalanced", r"No closing quotation"),
    ],
)
def test_argument_errors_are_usage_errors_and_start_nothing(
    magic: Any, line: str, message: str
) -> None:
    before = _sessions()
    with pytest.raises(UsageError, match=message):
        magic(line)
    assert not nbcluster.is_initialized()
    assert _sessions() == before


@pytest.mark.parametrize(
    "payload",
    [
        "\"__import__('builtins').setattr(__import__('builtins'), 'NBC_PWNED', 1)\"",
        "\"exec('import builtins; builtins.NBC_PWNED = 1')\"",
        '\'1 if setattr(__import__("builtins"), "NBC_PWNED", 1) else 2\'',
    ],
)
def test_magic_input_is_parsed_never_evaluated(magic: Any, payload: str) -> None:
    with pytest.raises(UsageError, match=r"argument --num-cpus: expected a number, got"):
        magic(f"start --num-cpus {payload}")
    with pytest.raises(UsageError, match=r"argument N: expected a whole number, got"):
        magic(f"scale {payload}")
    assert not hasattr(builtins, "NBC_PWNED")
    assert not nbcluster.is_initialized()


@pytest.mark.parametrize("command", ["", "start ", "connect ", "status ", "scale ", "stop "])
def test_help_prints_usage_and_does_nothing(
    magic: Any, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert magic(f"{command}--help") is None
    out = capsys.readouterr().out
    assert out.startswith(f"usage: %cluster {command}".rstrip() + " ")
    assert not nbcluster.is_initialized()


# --------------------------------------------------------------------------- lifecycle


def test_start_reattaches_and_status_shows_resources(
    magic: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    view = magic("start --num-cpus 2 --object-store-memory 256MiB")
    assert isinstance(view, ClusterView)
    assert view.started_here
    sessions = _sessions()
    session_dir = state.session_info()["session_dir"]

    assert magic("start --num-cpus 2") is view
    assert "already connected" in capsys.readouterr().out
    assert magic("start") is view
    assert magic("status") is view
    assert _sessions() == sessions
    assert state.session_info()["session_dir"] == session_dir

    bundle = view._repr_mimebundle_()
    text, html = bundle["text/plain"], bundle["text/html"]
    assert f"nbcluster at {view.address} (started by this kernel)" in text
    assert "nodes: 1 | CPUs used: 0 / 2 | GPUs used: 0 / 0" in text
    assert "object store used: 0 B / 256.0 MiB" in text
    assert "%cluster widgets" in text
    assert "<code>%cluster widgets</code>" in html
    assert "<td>0 / 2</td>" in html
    assert f"<code>{view.address}</code>" in html

    @nbcluster.remote
    def double(x: int) -> int:
        return 2 * x

    assert nbcluster.get(double.remote(4)) == 8


def test_scale_up_and_down(magic: Any) -> None:
    view = magic("start --num-cpus 1")
    assert magic("scale 2") is view
    status = view.status()
    assert len(status.nodes) == 2
    assert status.cpu_total == 2
    assert "nodes: 2 | CPUs used: 0 / 2" in view._repr_mimebundle_()["text/plain"]

    @nbcluster.remote
    def pid() -> int:
        return os.getpid()

    assert len(nbcluster.get([pid.remote() for _ in range(4)])) == 4
    magic("scale 1")
    poll_for(lambda: len(view.status().nodes) == 1, timeout=15, message="node not removed")
    assert view.status().cpu_total == 1


def test_start_with_several_nodes(magic: Any) -> None:
    view = magic("start --num-cpus 1 --nodes 2")
    assert len(view.status().nodes) == 2


def test_stop_leaves_no_process_and_a_new_start_works(
    magic: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    view = magic("start --num-cpus 1")
    session_dir = state.session_info()["session_dir"]
    assert cluster_processes(session_dir)
    magic("stop")
    assert f"stopped the cluster at {view.address}" in capsys.readouterr().out
    assert not nbcluster.is_initialized()
    assert_no_processes(session_dir, timeout=10)
    assert "Not connected any more" in view._repr_mimebundle_()["text/plain"]
    assert magic("status") is None
    assert "not connected" in capsys.readouterr().out
    magic("stop")
    assert "no cluster to stop" in capsys.readouterr().out

    view2 = magic("start --num-cpus 1")
    assert view2 is not view
    assert state.session_info()["session_dir"] != session_dir


def test_scale_without_a_cluster_is_a_clear_error(magic: Any) -> None:
    with pytest.raises(UsageError, match=r"^no cluster: run %cluster start first$"):
        magic("scale 2")


def test_connect_joins_a_cluster_it_cannot_scale(
    magic: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    other = nbcluster.LocalCluster(num_cpus=1).start()
    try:
        view = magic(f"connect {other.address}")
        assert not view.started_here
        assert view.address == other.address
        assert "(joined)" in view._repr_mimebundle_()["text/plain"]
        assert magic("connect auto") is view
        with pytest.raises(UsageError, match=r"already connected to .*%cluster stop first"):
            magic("connect 127.0.0.1:1")
        with pytest.raises(UsageError, match=r"joined the cluster at .* but did not start it"):
            magic("scale 2")

        @nbcluster.remote
        def one() -> int:
            return 1

        assert nbcluster.get(one.remote()) == 1
        magic("stop")
        assert "disconnected from the cluster" in capsys.readouterr().out
        assert cluster_processes(str(other.session_dir)), "joining must not stop the cluster"
    finally:
        other.stop()
    assert_no_processes(str(other.session_dir), timeout=10)


# --------------------------------------------------------------------------- hooks


def test_tasks_remember_their_cell_and_interrupt_policy_is_configurable(
    ip: Any, magic: Any
) -> None:
    magic("start --num-cpus 1 --on-interrupt keep")
    magics = ip.magics_manager.registry["ClusterMagics"]
    assert magics.hooks.on_interrupt == "keep"
    magic("start --on-interrupt cancel")
    assert magics.hooks.on_interrupt == "cancel"

    result = ip.run_cell(
        "import nbcluster, time\n"
        "@nbcluster.remote\n"
        "def nap(s):\n"
        "    time.sleep(s)\n"
        "nap_ref = nap.remote(30)\n"
        "nap_cell = get_ipython().magics_manager.registry['ClusterMagics']"
        ".hooks.current_cell()['msg_id']\n",
        store_history=True,
    )
    result.raise_error()
    nap_cell = ip.user_ns["nap_cell"]
    assert nap_cell.startswith("ipython-")
    nap_task = ip.user_ns["nap_ref"].task_id().hex()
    # The I/O loop registers a submitted task shortly after .remote() returns.
    mine = poll_for(
        lambda: state.pending_tasks(lambda ctx: bool(ctx) and ctx["msg_id"] == nap_cell),
        timeout=10,
        message=f"task not pending with its cell: {state.pending_tasks()}",
    )
    assert mine == [nap_task]
    # Between cells no cell runs: the interrupt handler finds nothing to cancel.
    assert magics.hooks.current_cell() is None
    magics.hooks.interrupt_handler()
    assert state.pending_tasks() == mine
    nbcluster.cancel(ip.user_ns.pop("nap_ref"))
    poll_for(lambda: not state.pending_tasks(), timeout=15, message="cancelled task still pending")


def test_interrupt_handler_cancels_only_the_running_cells_tasks(
    ip: Any, magic: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    magic("start --num-cpus 2")
    ip.run_cell(
        "import nbcluster, time\n"
        "from nbcluster.testing import poll_for\n"
        "@nbcluster.remote\n"
        "def nap(s):\n"
        "    time.sleep(s)\n"
        "hooks = get_ipython().magics_manager.registry['ClusterMagics'].hooks\n"
        "other_ref = nap.remote(30)\n",
        store_history=True,
    ).raise_error()
    # What get() does on KeyboardInterrupt, called from inside the cell being interrupted.
    ip.run_cell(
        "this_ref = nap.remote(30)\n"
        "poll_for(lambda: len(nbcluster.state.pending_tasks()) == 2, timeout=10)\n"
        "hooks.interrupt_handler()\n",
        store_history=True,
    ).raise_error()
    assert "cancelled 1 task(s) submitted by this cell" in capsys.readouterr().err
    with pytest.raises(TaskCancelledError):
        nbcluster.get(ip.user_ns.pop("this_ref"), timeout=30)
    assert state.pending_tasks() == [ip.user_ns["other_ref"].task_id().hex()]
    nbcluster.cancel(ip.user_ns.pop("other_ref"))


def test_hooks_follow_a_connection_made_with_init(ip: Any, magic: Any) -> None:
    nbcluster.init(num_cpus=1)
    session_dir = state.session_info()["session_dir"]
    try:
        # The hooks go on before the first cell that runs after init().
        ip.run_cell("import nbcluster\nnbcluster.put(1)", store_history=True).raise_error()
        ip.run_cell(
            "@nbcluster.remote\n"
            "def nap2():\n"
            "    __import__('time').sleep(30)\n"
            "ref2 = nap2.remote()",
            store_history=True,
        ).raise_error()
        with_context = poll_for(
            lambda: state.pending_tasks(lambda ctx: ctx is not None),
            timeout=10,
            message=f"no task with a submit context: {state.pending_tasks()}",
        )
        assert with_context == [ip.user_ns["ref2"].task_id().hex()]
        view = magic("status")
        assert view.address == state.session_info()["address"]
        nbcluster.cancel(ip.user_ns.pop("ref2"))
    finally:
        magic("stop")
    assert_no_processes(session_dir, timeout=10)


def test_widgets_uses_the_dashboard_when_there_is_one(
    magic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = types.ModuleType("nbcluster.jupyter.widgets")
    monkeypatch.setitem(sys.modules, "nbcluster.jupyter.widgets", fake)
    with pytest.raises(UsageError, match=r"live dashboard is not available.*%cluster status"):
        magic("widgets")
    sentinel = object()
    fake.dashboard = lambda: sentinel  # type: ignore[attr-defined]
    assert magic("widgets") is sentinel


def test_unload_removes_the_magic_and_the_hooks(ip: Any, magic: Any) -> None:
    magic("start --num-cpus 1")
    ip.run_line_magic("unload_ext", "nbcluster")
    try:
        with pytest.raises(UsageError, match=r"Line magic function `%cluster` not found"):
            ip.run_line_magic("cluster", "status")
        ip.run_cell(
            "import nbcluster, time\n"
            "@nbcluster.remote\n"
            "def nap3():\n"
            "    time.sleep(30)\n"
            "ref3 = nap3.remote()",
            store_history=True,
        ).raise_error()
        poll_for(lambda: state.pending_tasks(), timeout=10, message="task not registered")
        assert state.pending_tasks(lambda ctx: ctx is not None) == []
    finally:
        ip.run_line_magic("load_ext", "nbcluster")
    # Loading again hooks into the connection that exists.
    ip.run_cell("ref4 = nap3.remote()", store_history=True).raise_error()
    poll_for(
        lambda: state.pending_tasks(lambda ctx: ctx is not None),
        timeout=10,
        message="hooks not installed on load",
    )
    nbcluster.cancel(ip.user_ns.pop("ref3"))
    nbcluster.cancel(ip.user_ns.pop("ref4"))


def test_importing_nbcluster_loads_no_jupyter_code() -> None:
    code = (
        "import sys, nbcluster\n"
        "assert callable(nbcluster.load_ipython_extension)\n"
        "assert 'load_ipython_extension' not in nbcluster.__all__\n"
        "prefixes = ('IPython', 'ipykernel', 'nbcluster.jupyter')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(prefixes))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- notebook metadata


def _b64(record: Any) -> str:
    return base64.b64encode(json.dumps(record).encode()).decode()


@pytest.fixture
def published(ip: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The records ``%cluster start`` publishes for the front end to store."""
    records: list[Any] = []
    real = ip.display_pub.publish

    def publish(data: Any, metadata: Any = None, **kw: Any) -> Any:
        if notebook_spec.METADATA_MIME in data:
            records.append(data[notebook_spec.METADATA_MIME])
        return real(data, metadata=metadata, **kw)

    monkeypatch.setattr(ip.display_pub, "publish", publish)
    monkeypatch.delenv(notebook_spec.ENV_VAR, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return records


def test_start_records_the_cluster_and_recreates_it_from_the_notebook(
    magic: Any, published: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    magic("start --num-cpus 1 --nodes 2")
    (record,) = published
    assert record["version"] == 1 and record["cluster"] == {"num_cpus": 1, "nodes": 2}
    magic("stop")
    capsys.readouterr()

    # Elsewhere: the front end handed the record to a fresh kernel; no arguments.
    monkeypatch.setenv(notebook_spec.ENV_VAR, _b64(record))
    view = magic("start")
    out = capsys.readouterr().out
    assert (
        "nbcluster: starting the cluster recorded in the notebook's metadata: "
        "--num-cpus 1 --nodes 2\n"
    ) in out
    assert "recorded with" not in out  # same versions: nothing to say
    status = view.status()
    assert len(status.nodes) == 2 and status.cpu_total == 2
    assert published[-1]["cluster"] == record["cluster"]
    magic("stop")

    # Arguments win over the record, and --ignore-metadata ignores it.
    magic("start --num-cpus 1")
    assert len(state.node_stats()) == 1
    magic("stop")
    capsys.readouterr()
    magic("start --ignore-metadata")
    assert "recorded in" not in capsys.readouterr().out
    assert len(state.node_stats()) == 1


def test_a_bad_or_foreign_record_is_explained(
    magic: Any, published: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv(notebook_spec.ENV_VAR, _b64({"version": 1, "cluster": {"nodes": 0}}))
    with pytest.raises(
        UsageError,
        match=r"^%cluster start: the notebook's nbcluster metadata cannot be used: cluster\.nodes "
        r"must be a whole number >= 1, got 0\. Start with arguments to replace it, or with "
        r"--ignore-metadata\.$",
    ):
        magic("start")
    assert not nbcluster.is_initialized()
    older = {
        "version": 1,
        "cluster": {"num_cpus": 1},
        "recorded_with": {"python": "3.10.0", "nbcluster": "0.0.1"},
    }
    monkeypatch.setenv(notebook_spec.ENV_VAR, _b64(older))
    magic("start")
    out = capsys.readouterr().out
    assert "(recorded with python 3.10.0, nbcluster 0.0.1; this kernel has python " in out


def test_runtime_env_is_passed_and_recorded(
    magic: Any, published: list[Any], monkeypatch: Any
) -> None:
    real_init = _api.init
    seen: list[Any] = []

    def init_with_runtime_env(*args: Any, runtime_env: Any = None, **kwargs: Any) -> Any:
        seen.append(runtime_env)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(_api, "init", init_with_runtime_env)
    magic("""start --num-cpus 1 --runtime-env '{"env_vars": {"STAGE": "test"}}'""")
    assert seen == [{"env_vars": {"STAGE": "test"}}]
    assert published[-1]["runtime_env"] == {"env_vars": {"STAGE": "test"}}
    magic("stop")

    def init_without(*args: Any, **kwargs: Any) -> Any:
        return real_init(*args, **kwargs)

    monkeypatch.setattr(_api, "init", init_without)
    with pytest.raises(UsageError, match=r"this nbcluster's init\(\) takes no runtime_env"):
        magic("""start --runtime-env '{"env_vars": {}}'""")
    with pytest.raises(UsageError, match=r"--runtime-env: expected a JSON object"):
        magic("start --runtime-env '[1]'")
    assert not nbcluster.is_initialized()


def test_output_mode_magic(magic: Any, capsys: pytest.CaptureFixture[str]) -> None:
    magic("output")
    assert capsys.readouterr().out == "nbcluster: task output goes to each cell's log area (log)\n"
    magic("output stream")
    assert "the cell as plain text (stream)" in capsys.readouterr().out
    magic("output log")
    with pytest.raises(UsageError, match="invalid choice: 'html'"):
        magic("output html")


def test_out_refs_magic(magic: Any, capsys: pytest.CaptureFixture[str]) -> None:
    magic("out-refs")
    assert capsys.readouterr().out == (
        "nbcluster: the 10 most recent outputs keep their refs; older ones are dropped (last 10)\n"
    )
    magic("out-refs clear")
    assert "dropped after every cell (clear)" in capsys.readouterr().out
    with pytest.raises(UsageError, match=r"^%cluster out-refs: not an output-ref policy: 'last x'"):
        magic("out-refs last x")
    magic("out-refs last 10")
