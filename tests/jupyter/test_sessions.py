"""Sessions that resume (issue 13, item 3), in real kernels against a cluster that outlives them.

The cluster is started by this test process, so kernels come and go while it stays. A
notebook connects with ``--session exp``, makes a named detached actor and keeps two
results; after a kernel restart, connecting with the same session puts them back. In
client mode (``nbcluster://``) the same works, and the link rides out a head that stops
answering for a few seconds (it reconnects by itself within its grace period).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbcluster import LocalCluster
from nbcluster.testing import assert_no_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIRST_RUN = """
import numpy as np
import nbcluster

@nbcluster.remote
class Counter:
    def __init__(self):
        self.n = 0
    def incr(self):
        self.n += 1
        return self.n

counter = Counter.options(name="counter", namespace="exp", lifetime="detached").remote()
assert nbcluster.get([counter.incr.remote() for _ in range(3)]) == [1, 2, 3]
arr = nbcluster.put(np.arange(10))
answer = 42
"""


@pytest.fixture(scope="module")
def outliving() -> Iterator[LocalCluster]:
    """A 2-CPU cluster owned by this test process, not by any kernel."""
    cluster = LocalCluster(num_cpus=2).start()
    yield cluster
    session_dir = cluster.session_dir
    cluster.stop()
    assert session_dir is not None
    assert_no_processes(session_dir, timeout=15)


def error_of(k: Any, code: str) -> tuple[str, str]:
    """Run ``code``, which must fail; return (exception name, message)."""
    reply = k.wait_done(k.submit(code))
    assert reply["content"]["status"] == "error", code
    return reply["content"]["ename"], reply["content"]["evalue"]


def _env(cluster: LocalCluster) -> dict[str, str]:
    return {"NBCLUSTER_TOKEN_FILE": str(Path(str(cluster.session_dir)) / "token")}


@pytest.mark.parametrize("mode", ["driver", "client"])
def test_a_session_gets_back_its_actors_and_kept_results(
    kernel: Any, outliving: LocalCluster, mode: str
) -> None:
    address = outliving.address if mode == "driver" else f"nbcluster://{outliving.address}"
    session = f"exp-{mode}"
    k = kernel(env=_env(outliving))
    first = k.run(f"%load_ext nbcluster\n%cluster connect {address} --session {session}")
    assert f"nbcluster: session '{session}': got back nothing yet (a new session)" in (
        k.stream_text(first)
    )
    k.run(FIRST_RUN.replace('namespace="exp"', f'namespace="{session}"'))
    kept = k.run("%cluster keep arr answer")
    assert f"nbcluster: session '{session}' keeps arr, answer" in k.stream_text(kept)
    # put(name=): kept for the session from code; a name is kept once.
    k.run(
        "model_ref = nbcluster.put({'w': [1, 2, 3]}, name='model')\n"
        "assert nbcluster.get(model_ref) == {'w': [1, 2, 3]}\n"
        "assert nbcluster.get(nbcluster.get_named('model')) == {'w': [1, 2, 3]}\n"
        "nbcluster.put('spaced out', name='run 1')"
    )
    assert error_of(k, "nbcluster.put(1, name=7)") == (
        "TypeError",
        "put(name=...) takes a str, got int: 7",
    )
    assert error_of(k, "nbcluster.put(2, name='model')") == (
        "ValueError",
        f"a result named 'model' is already kept in session '{session}'; choose another name, "
        "or drop the old one first with nbcluster.jupyter.session.forget('model')",
    )
    assert error_of(k, "nbcluster.get_named('nope')") == (
        "ValueError",
        f"no result named 'nope' in session '{session}' (it keeps 'arr', 'answer', 'model', "
        "'run 1')",
    )
    assert k.eval_text("nbcluster.get(nbcluster.get_named('model'))") == "{'w': [1, 2, 3]}"

    k.km.restart_kernel(now=True)
    k.client.wait_for_ready(timeout=180)
    again = k.run(f"%load_ext nbcluster\n%cluster connect {address} --session {session}")
    assert (
        f"nbcluster: session '{session}': got back actors counter; kept results arr, answer, "
        "model\n"
    ) in k.stream_text(again)
    assert (
        "nbcluster: named results 'run 1': get them with nbcluster.get_named(NAME)"
    ) in k.stream_text(again)
    assert k.eval_text("__import__('nbcluster').get(model)") == "{'w': [1, 2, 3]}"
    assert (
        k.eval_text("__import__('nbcluster').get(__import__('nbcluster').get_named('run 1'))")
        == "spaced out"
    )
    assert k.eval_text("__import__('nbcluster').get(counter.incr.remote())") == "4"
    assert k.eval_text("__import__('nbcluster').get(arr).tolist()") == str(list(range(10)))
    assert k.eval_text("__import__('nbcluster').get(answer)") == "42"
    # Another session sees none of it.
    k.run("%cluster stop")
    other = k.run(f"%cluster connect {address} --session other-{mode}")
    assert "got back nothing yet" in k.stream_text(other)
    k.run("%cluster stop")


def test_client_mode_rides_out_a_head_that_stops_answering(
    kernel: Any, outliving: LocalCluster
) -> None:
    k = kernel(env=_env(outliving))
    k.run(
        f"%load_ext nbcluster\n%cluster connect nbcluster://{outliving.address}\n"
        "import nbcluster\n"
        "@nbcluster.remote\n"
        "def plus(x):\n"
        "    return x + 1\n"
        "assert nbcluster.get(plus.remote(1)) == 2"
    )
    head_pid = int((Path(str(outliving.session_dir)) / "head.pid").read_text())
    os.kill(head_pid, signal.SIGSTOP)
    try:
        cell = k.submit("print('LINK', nbcluster.get(plus.remote(41), timeout=60))")
        time.sleep(3.0)  # the call is retried while the head does not answer
        assert not k.idle(cell)
    finally:
        os.kill(head_pid, signal.SIGCONT)
    k.wait_done(cell, timeout=60)
    k.wait_for(lambda: "LINK 42" in k.stream_text(cell), what="the answer after the outage")
    k.run("%cluster stop")
