"""The Driver interface: both implementations have every call, with the same parameters.

The API layer calls ``context.require_driver()`` and never asks which implementation it
got, so a call missing from (or shaped differently in) the client-mode ``ProxyClient`` would
only show up as an ``AttributeError`` in client mode. These checks need no cluster.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from nbcluster._runtime import display
from nbcluster._runtime.core.driver import CoreDriver
from nbcluster._runtime.driver import DRIVER_CALLS, Driver
from nbcluster._runtime.exceptions import TaskError
from nbcluster._runtime.proxy.client import ProxyClient
from nbcluster._runtime.proxy.server import ProxyService

CALLS = sorted(
    name
    for name, value in vars(Driver).items()
    if callable(value) and not name.startswith("_") and name not in dir(object)
)


def _params(fn: object) -> list[tuple[str, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind) for p in sig.parameters.values()]


def test_the_protocol_lists_the_calls_the_issue_names() -> None:
    for name in (
        "submit_task",
        "create_actor",
        "call_actor",
        "put",
        "get",
        "wait",
        "cancel",
        "create_placement_group",
        "placement_group_table",
        "nodes",
        "actor_state",
    ):
        assert name in CALLS


@pytest.mark.parametrize("impl", [CoreDriver, ProxyClient])
@pytest.mark.parametrize("name", CALLS)
def test_each_implementation_has_each_call_with_the_protocols_parameters(
    impl: type, name: str
) -> None:
    method = getattr(impl, name, None)
    assert method is not None, f"{impl.__name__} lacks Driver.{name}"
    want = _params(getattr(Driver, name))
    got = _params(method)
    # An implementation may add optional parameters after the Protocol's own.
    assert got[: len(want)] == want, f"{impl.__name__}.{name}{got} != Driver.{name}{want}"


def test_the_core_driver_reads_its_attributes_from_the_client() -> None:
    for attr in ("address", "namespace", "config", "closed"):
        assert isinstance(inspect.getattr_static(CoreDriver, attr), property)


def test_the_proxy_forwards_exactly_the_driver_calls_and_they_exist() -> None:
    assert set(DRIVER_CALLS) <= set(CALLS)
    # The proxy service builds one operation per forwarded call from a CoreDriver.
    fake = object.__new__(CoreDriver)
    service = ProxyService(fake)
    assert set(DRIVER_CALLS) <= set(service.ops)
    assert {"connect", "release", "disconnect"} <= set(service.ops)


def test_task_error_display_uses_the_installed_renderer_and_text_without_one() -> None:
    err = TaskError.from_exception(ValueError("boom"), "f")
    display.html(object())  # runs the pending loaders (nbcluster's Jupyter renderers)
    saved = display._renderers.pop(TaskError, None)
    try:
        bundle = err._repr_mimebundle_()
        assert bundle == {"text/plain": f"TaskError: {err}"}
        assert err._repr_html_() is None
        display.set_renderer(
            TaskError, display.Renderer(lambda e: {"text/html": "<b>x</b>"}, lambda e: "<i>y</i>")
        )
        assert err.as_instanceof_cause()._repr_mimebundle_() == {"text/html": "<b>x</b>"}
        assert err._repr_html_() == "<i>y</i>"
    finally:
        display.set_renderer(TaskError, saved)


def test_the_jupyter_renderers_load_on_the_first_display_not_at_import() -> None:
    code = (
        "import sys, nbcluster\n"
        "from nbcluster.exceptions import TaskError\n"
        "assert 'nbcluster.jupyter.display' not in sys.modules\n"
        "err = TaskError.from_exception(ValueError('boom'), 'f').as_instanceof_cause()\n"
        "bundle = err._repr_mimebundle_()\n"
        "assert 'nbcluster.jupyter.display' in sys.modules\n"
        "assert 'boom' in bundle['text/html'], bundle\n"
        "ref = nbcluster.ObjectRef.nil()\n"
        "assert 'unknown' in ref._repr_mimebundle_()['text/plain']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
