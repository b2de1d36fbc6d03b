"""Issue 13, item 6 in a real kernel: rich ``display()`` from tasks and actors.

A task calls ``IPython.display.display`` on an HTML object and on a PNG image (and an
actor uses ``nbcluster.util.display``, which needs no IPython on the worker): the mime
bundles land in the submitting cell's log area, in order with what the task printed and
with their mime types; with ``%cluster output stream`` they are ``display_data`` messages
under the submitting cell. A nested task's displays reach the cell too.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

SHOW = f"""
import base64
import nbcluster
from IPython.display import HTML, Image, display
from nbcluster.util import display as nbc_display

PNG = base64.b64decode({PNG_B64!r})

class Badge:
    def _repr_html_(self):
        return "<span class='badge'>actor badge</span>"
    def __repr__(self):
        return "Badge()"

@nbcluster.remote
def show(i):
    print("before", i)
    display(HTML(f"<b>task {{i}}</b>"))
    display(Image(data=PNG))
    print("after", i)
    return i

@nbcluster.remote(num_cpus=0)
def outer():
    return nbcluster.get(show.remote(3))

@nbcluster.remote
class Reporter:
    def report(self):
        nbc_display(Badge())
        return "reported"
"""


def rich_lines(state: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(level, text, bundle) of each line of a log area's state."""
    rich = state.get("rich", {})
    return [(ln[3], ln[4], rich.get(str(ln[0]))) for ln in state.get("lines", [])]


def test_display_in_a_task_lands_in_the_cells_log_area_as_rich_output(kernel: Any) -> None:
    k = kernel()
    k.start_cluster("--num-cpus 1")
    k.run(SHOW)
    cell = k.run("assert nbcluster.get(show.remote(1)) == 1")
    area = k.log_area(cell)
    assert area is not None

    def four_lines() -> bool:
        return len(k.widget_state(area).get("lines", [])) >= 4 and bool(
            k.widget_state(area).get("rich")
        )

    k.wait_for(four_lines, what="the task's prints and displays in the log area")
    lines = rich_lines(k.widget_state(area))
    assert [level for level, _, _ in lines] == ["stdout", "display", "display", "stdout"]
    assert re.fullmatch(r"\(show pid=\d+\) before 1\n", lines[0][1])
    assert re.fullmatch(r"\(show pid=\d+\) <IPython.core.display.HTML object>\n", lines[1][1])
    html, png = lines[1][2], lines[2][2]
    assert html is not None and html["data"] == {"text/html": "<b>task 1</b>"}
    assert png is not None and set(png["data"]) == {"image/png"}
    assert base64.b64decode(png["data"]["image/png"]) == base64.b64decode(PNG_B64)
    assert "after 1" in lines[3][1]
    assert "IPython.core.display" not in k.stream_text(), "not printed as a repr"

    # An actor, with nbcluster's own display (no IPython needed on the worker).
    actor_cell = k.run(
        "r = Reporter.remote()\nassert nbcluster.get(r.report.remote()) == 'reported'"
    )
    actor_area = k.log_area(actor_cell)
    assert actor_area is not None
    k.wait_for(lambda: k.widget_state(actor_area).get("rich"), what="the actor's display")
    ((level, text, bundle),) = rich_lines(k.widget_state(actor_area))
    assert level == "display" and re.fullmatch(r"\(Reporter.report pid=\d+\) Badge\(\)\n", text)
    assert bundle is not None
    assert bundle["data"] == {"text/html": "<span class='badge'>actor badge</span>"}
    assert k.widget_state(actor_area)["sources"] == [["Reporter.report", "actor"]]

    # A nested task's displays reach the cell through the task that submitted it.
    nested = k.run("assert nbcluster.get(outer.remote()) == 3")
    nested_area = k.log_area(nested)
    assert nested_area is not None
    k.wait_for(
        lambda: len(k.widget_state(nested_area).get("rich", {})) == 2, what="the nested displays"
    )
    k.wait_for(lambda: len(k.widget_state(nested_area)["lines"]) == 4, what="the nested prints")
    lines = rich_lines(k.widget_state(nested_area))
    assert [level for level, _, _ in lines] == ["stdout", "display", "display", "stdout"]
    assert re.fullmatch(r"\(outer pid=\d+\) \(show pid=\d+\) before 3\n", lines[0][1])
    assert lines[1][2] is not None and lines[1][2]["data"] == {"text/html": "<b>task 3</b>"}
    assert lines[2][2] is not None and set(lines[2][2]["data"]) == {"image/png"}

    # As plain messages: display_data under the submitting cell, after the text before it.
    k.run("%cluster output stream")
    streamed = k.run("assert nbcluster.get(show.remote(2)) == 2")

    def displays() -> list[dict[str, Any]]:
        return [
            m
            for m in k.messages
            if m["msg_type"] == "display_data"
            and m["parent_header"].get("msg_id") == streamed
            and "application/vnd.jupyter.widget-view+json" not in m["content"]["data"]
        ]

    k.wait_for(lambda: len(displays()) == 2, what="two display_data messages")
    first, second = displays()
    assert first["content"]["data"]["text/html"] == "<b>task 2</b>"
    assert first["content"]["data"]["text/plain"] == "<IPython.core.display.HTML object>"
    assert base64.b64decode(second["content"]["data"]["image/png"]) == base64.b64decode(PNG_B64)
    own = [m for m in k.messages if m["parent_header"].get("msg_id") == streamed]
    order = [
        "before"
        if m["msg_type"] == "stream" and "before 2" in m["content"]["text"]
        else m["msg_type"]
        for m in own
        if m["msg_type"] in ("stream", "display_data")
    ]
    assert order.index("before") < order.index("display_data")
    k.wait_for(lambda: "after 2" in k.stream_text(streamed), what="the text after the displays")
    assert k.log_area(streamed) is None
