"""Rich reprs of ``ObjectRef``, ``TaskError`` and the cluster: text and HTML, escaped."""

from __future__ import annotations

import html
import re
import time
from typing import Any

import numpy as np
import pytest
from IPython.core.formatters import DisplayFormatter

import nbcluster
from nbcluster.exceptions import TaskCancelledError, TaskError
from nbcluster.jupyter.display import format_bytes, render_template
from nbcluster.testing import poll_for

pytestmark = pytest.mark.integration

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"


def _format(obj: Any) -> dict[str, Any]:
    """What a Jupyter front end receives for ``obj`` (IPython's display formatter)."""
    data, _ = DisplayFormatter().format(obj)
    return data


@nbcluster.remote
def _nap(s: float) -> float:
    time.sleep(s)
    return s


@nbcluster.remote
def _fail(message: str) -> None:
    raise ValueError(message)


def test_ready_ref_inline_and_in_store(shared_cluster: Any) -> None:
    small = nbcluster.put(12345)
    assert repr(small) == f"ObjectRef({small.hex()})"
    data = _format(small)
    assert re.fullmatch(
        rf"ObjectRef\({small.hex()}\) ready: \d+ B, inline in the owner's memory",
        data["text/plain"],
    )
    assert f"<code>ObjectRef({small.hex()})</code>" in data["text/html"]
    assert ">ready</span>" in data["text/html"]
    assert small._repr_html_() == data["text/html"]

    big = nbcluster.put(np.zeros(1 << 20))  # 8 MiB: goes to the node's object store
    text = _format(big)["text/plain"]
    assert re.fullmatch(
        rf"ObjectRef\({big.hex()}\) ready: 8\.0 MiB, in the object store of node [0-9a-f]{{12}}",
        text,
    ), text


def test_pending_and_failed_refs(shared_cluster: Any) -> None:
    pending = _nap.remote(30)
    assert _format(pending)["text/plain"] == (
        f"ObjectRef({pending.hex()}) pending: the task that makes it has not finished"
    )
    assert ">pending</span>" in pending._repr_html_()
    nbcluster.cancel(pending)
    with pytest.raises(TaskCancelledError):
        nbcluster.get(pending, timeout=30)

    failed = _fail.remote("boom")
    nbcluster.wait([failed], timeout=30)
    poll_for(lambda: "failed" in _format(failed)["text/plain"], timeout=10)
    assert _format(failed)["text/plain"] == (
        f"ObjectRef({failed.hex()}) failed: nbcluster.get(ref) raises the task's error"
    )


def test_task_error_repr_escapes_remote_text(shared_cluster: Any) -> None:
    with pytest.raises(TaskError) as info:
        nbcluster.get(_fail.remote(HOSTILE), timeout=30)
    err = info.value
    data = _format(err)
    page = data["text/html"]
    assert "<script" not in page and "<img" not in page
    assert html.escape(HOSTILE) in page
    assert "<pre" in page and "Traceback" in page
    assert f"<code>{html.escape(err.function_name)}</code>" in page
    assert "<code>ValueError</code>" in page
    assert f"pid {err.pid}" in page
    # IPython prints exceptions' text/plain with its own pretty printer; ours is the fallback
    # for other front ends.
    assert data["text/plain"].startswith(f"{type(err).__name__}(function_name=")
    text = err._repr_mimebundle_()["text/plain"]
    assert text.startswith(f"{type(err).__name__}: _fail raised an exception (pid={err.pid}")
    assert HOSTILE in text  # plain text is shown as text, never as markup
    assert repr(err).startswith(type(err).__name__ + "(function_name=")


def test_cluster_view_from_magics_renders_escaped_html(shared_cluster: Any) -> None:
    from nbcluster.jupyter.display import ClusterView

    view = ClusterView(shared_cluster)
    # The view is as of the node's last heartbeat (at most heartbeat_interval_s old).
    data = poll_for(
        lambda: next((d for d in [_format(view)] if "CPUs used: 0 / 2" in d["text/plain"]), None)
    )
    assert "<td>0 / 2</td>" in data["text/html"]
    assert repr(view) == f"ClusterView(address={shared_cluster.address!r}, started by this kernel)"


def test_templates_escape_every_value() -> None:
    page = render_template(
        "object_ref.html", object_id=HOSTILE, state="ready", color="#292", details='"quoted"'
    )
    assert "<script" not in page and "<img" not in page
    assert "&quot;quoted&quot;" in page
    with pytest.raises(KeyError):
        render_template("object_ref.html", object_id="x")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (8 << 20, "8.0 MiB"), (3 << 40, "3.0 TiB")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text
