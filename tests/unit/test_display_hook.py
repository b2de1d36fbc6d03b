"""Rich ``display()`` on a worker without a kernel: formatting, encoding, and the IPython patch.

The patch of IPython's display functions is tried in a fresh interpreter (it changes
IPython for the whole process), once with IPython imported after the hook is installed
(the import hook) and once without IPython at all (``nbcluster.util.display``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nbcluster._runtime.worker import display_hook
from nbcluster._runtime.worker.display_hook import _fallback_bundle, encode_bundle

ROOT = Path(__file__).resolve().parents[2]
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class Rich:
    def _repr_html_(self) -> str:
        return "<b>rich</b>"

    def _repr_png_(self) -> tuple[bytes, dict[str, Any]]:
        return PNG, {"width": 10}

    def _repr_latex_(self) -> str:
        raise RuntimeError("broken repr")

    def __repr__(self) -> str:
        return "Rich()"


class Bundled(Rich):
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/html": "<i>from the bundle</i>", "text/csv": "a,b"}


def test_the_fallback_formats_repr_methods_without_ipython() -> None:
    data, md = _fallback_bundle(Rich())
    assert data == {"text/html": "<b>rich</b>", "image/png": PNG, "text/plain": "Rich()"}
    assert md == {"image/png": {"width": 10}}
    data, _ = _fallback_bundle(Bundled())
    assert data["text/html"] == "<i>from the bundle</i>" and data["text/csv"] == "a,b"
    data, _ = _fallback_bundle(Rich(), include={"image/png"})
    assert set(data) == {"image/png"}
    data, _ = _fallback_bundle(Rich(), exclude={"image/png"})
    assert set(data) == {"text/html", "text/plain"}
    assert _fallback_bundle({"b": 2, "a": 1})[0] == {"text/plain": "{'a': 1, 'b': 2}"}


def test_bundles_are_encoded_as_json_with_base64_images() -> None:
    bundle = json.loads(
        encode_bundle({"image/png": PNG, "text/plain": "img", "x/bad": object()}, {"a": 1})
    )
    assert bundle == {
        "data": {"image/png": base64.b64encode(PNG).decode(), "text/plain": "img"},
        "metadata": {"a": 1},
    }
    assert json.loads(encode_bundle({"text/html": "<p>"}))["data"]["text/plain"] == (
        "<display output>"
    )


def test_a_bundle_over_the_limit_keeps_only_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(display_hook, "MAX_BUNDLE_CHARS", 1000)
    bundle = json.loads(encode_bundle({"image/png": b"x" * 5000, "text/plain": "big"}))
    assert set(bundle["data"]) == {"text/plain"}
    assert bundle["data"]["text/plain"].startswith("big\n[display output of ")
    assert "only its text is shown" in bundle["data"]["text/plain"]


WORKER = """
import base64, json, sys
{block}
from nbcluster._runtime.worker.output import OutputCapture
from nbcluster._runtime.worker import display_hook

cap = OutputCapture()
display_hook.install(cap)
{body}
slot = cap.begin(b"t", None)
{in_task}
print(json.dumps(cap.end(slot)[2]))
"""


def run_worker(body: str, in_task: str, block: str = "") -> list[list[Any]]:
    code = WORKER.format(block=block, body=textwrap.dedent(body), in_task=textwrap.dedent(in_task))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_ipython_display_in_a_task_sends_bundles_once_ipython_is_imported() -> None:
    chunks = run_worker(
        body="""
        assert "IPython" not in sys.modules
        from IPython.display import HTML, Image, clear_output, display, update_display
        import IPython.core.display_functions as df
        assert display is df.display and getattr(display, "__nbcluster_display_hook__")
        display("outside a task")  # IPython's own: printed
        """,
        in_task=f"""
        PNG = base64.b64decode({base64.b64encode(PNG).decode()!r})
        cap.write("stdout", "before\\n")
        display(HTML("<b>bold</b>"))
        handle = display(Image(data=PNG), display_id=True)
        handle.update(HTML("<i>updated</i>"))
        clear_output()
        from IPython.display import display_html
        display_html("<u>raw</u>", raw=True)
        """,
    )
    streams = [c[0] for c in chunks]
    assert streams == ["stdout", "display", "display", "display", "display"]
    bundles = [json.loads(c[1]) for c in chunks[1:]]
    assert bundles[0]["data"]["text/html"] == "<b>bold</b>"
    assert bundles[1]["data"]["image/png"] == base64.b64encode(PNG).decode()
    assert bundles[1]["data"]["text/plain"] == "<IPython.core.display.Image object>"
    assert bundles[2]["data"]["text/html"] == "<i>updated</i>"
    assert bundles[3]["data"] == {"text/html": "<u>raw</u>", "text/plain": "<display output>"}


def test_nbcluster_display_works_without_ipython() -> None:
    chunks = run_worker(
        block="sys.modules['IPython'] = None  # IPython cannot be imported",
        body="""
        from nbcluster.util import display
        class Chart:
            def _repr_svg_(self):
                return "<svg xmlns='http://www.w3.org/2000/svg'/>"
            def __repr__(self):
                return "Chart()"
        display(Chart())  # outside a task: printed
        """,
        in_task="""
        display(Chart(), {"x": 1})
        display({"text/html": "<p>raw</p>"}, raw=True)
        """,
    )
    bundles = [json.loads(c[1]) for c in chunks]
    assert [c[0] for c in chunks] == ["display"] * 3
    assert bundles[0]["data"] == {
        "image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'/>",
        "text/plain": "Chart()",
    }
    assert bundles[1]["data"] == {"text/plain": "{'x': 1}"}
    assert bundles[2]["data"]["text/html"] == "<p>raw</p>"
