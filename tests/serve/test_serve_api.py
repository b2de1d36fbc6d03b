"""Serve's API on a real cluster: handles, composition, HTTP, config updates, status."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import cloudpickle
import httpx
import pytest
from pydantic import BaseModel

import nbcluster
from nbcluster import serve
from nbcluster.serve.exceptions import ServeException
from nbcluster.testing import pid_alive, poll_for

NO_CPU = {"num_cpus": 0}


class Item(BaseModel):
    name: str
    qty: int


# Workers cannot import this test module: classes defined here travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.integration


@serve.deployment(ray_actor_options=NO_CPU)
class Counter:
    def __init__(self, start: int) -> None:
        self.n = start

    def __call__(self, request: Any) -> dict[str, Any]:
        return {"n": self.n, "path": request.url.path, "root": request.scope["root_path"]}

    def add(self, k: int = 1) -> int:
        self.n += k
        return self.n

    async def slow(self, s: float) -> float:
        await asyncio.sleep(s)
        return s

    def where(self) -> tuple[int, str, str]:
        ctx = serve.get_replica_context()
        return os.getpid(), ctx.deployment, ctx.replica_tag


def test_class_handle_calls_methods_in_order(serve_cluster: Any) -> None:
    handle = serve.run(Counter.bind(10), name="counter", route_prefix="/counter", _display=False)
    assert [handle.add.remote().result() for _ in range(3)] == [11, 12, 13]
    assert handle.add.remote(k=5).result(timeout_s=10) == 18
    pid, deployment, tag = handle.where.remote().result()
    assert deployment == "Counter" and tag and pid != os.getpid()
    with pytest.raises(TimeoutError):
        handle.slow.remote(2).result(timeout_s=0.1)
    st = serve.status().applications["counter"]
    assert st.status == "RUNNING" and st.deployments["Counter"].status == "HEALTHY"
    assert st.deployments["Counter"].replica_states == {"RUNNING": 1}
    assert serve.get_app_handle("counter").add.remote(0).result() == 18


def test_handle_errors_carry_the_user_exception(serve_cluster: Any) -> None:
    @serve.deployment(ray_actor_options=NO_CPU)
    def divide(x: int) -> float:
        return 1 / x

    handle = serve.run(divide.bind(), name="div", route_prefix=None, _display=False)
    assert handle.remote(4).result() == 0.25
    with pytest.raises(ZeroDivisionError):
        handle.remote(0).result()
    with pytest.raises(AttributeError, match="is a function"):
        handle.other.remote().result()


def test_composition_and_passing_responses_without_waiting(serve_cluster: Any) -> None:
    @serve.deployment(ray_actor_options=NO_CPU)
    class Doubler:
        async def __call__(self, x: int, delay: float = 0.05) -> int:
            await asyncio.sleep(delay)
            return 2 * x

    @serve.deployment(ray_actor_options=NO_CPU)
    class Adder:
        def __call__(self, x: int, y: int) -> int:
            return x + y

    @serve.deployment(ray_actor_options=NO_CPU)
    class Pipeline:
        def __init__(self, doubler: Any, adder: Any) -> None:
            self.doubler = doubler
            self.adder = adder

        async def __call__(self, x: int) -> int:
            doubled = self.doubler.remote(x)  # not awaited: passed on as it is
            return await self.adder.remote(doubled, 1)

    handle = serve.run(
        Pipeline.bind(Doubler.bind(), Adder.bind()), name="pipe", route_prefix=None, _display=False
    )
    assert handle.remote(5).result() == 11
    # From the driver too: the caller does not wait for the first response.
    d = serve.get_deployment_handle("Doubler", app_name="pipe")
    a = serve.get_deployment_handle("Adder", app_name="pipe")
    first = d.remote(20, 3.0)
    response = a.remote(first, 2)
    assert not first.done()  # passing it on did not wait for it
    assert response.result(timeout_s=60) == 42 and first.done()

    async def gather() -> list[int]:
        return list(await asyncio.gather(*(handle.remote(i) for i in range(8))))

    assert asyncio.run(gather()) == [2 * i + 1 for i in range(8)]
    with pytest.raises(ServeException, match="does not exist in application 'pipe'"):
        serve.get_deployment_handle("Nope", app_name="pipe")
    with pytest.raises(ServeException, match="Application 'nope' does not exist"):
        serve.get_app_handle("nope")


def test_sync_result_inside_an_async_replica_method_is_refused(serve_cluster: Any) -> None:
    @serve.deployment(ray_actor_options=NO_CPU)
    def leaf() -> int:
        return 1

    @serve.deployment(ray_actor_options=NO_CPU)
    class Caller:
        def __init__(self, leaf: Any) -> None:
            self.leaf = leaf

        async def bad(self) -> int:
            return self.leaf.remote().result()

        def fine(self) -> int:  # a sync method may block
            return self.leaf.remote().result()

    handle = serve.run(Caller.bind(leaf.bind()), name="sync", route_prefix=None, _display=False)
    with pytest.raises(RuntimeError, match="Use `await response` instead"):
        handle.bad.remote().result()
    assert handle.fine.remote().result() == 1


def test_http_routes_and_errors(serve_cluster: Any, serve_url: str) -> None:
    serve.run(Counter.bind(1), name="a", route_prefix="/a", _display=False)

    @serve.deployment(ray_actor_options=NO_CPU)
    def boom(request: Any) -> str:
        raise RuntimeError("do not show this to the client")

    serve.run(boom.bind(), name="b", route_prefix="/b", _display=False)
    url = serve_url
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.get("/a/x/y")
        assert r.status_code == 200
        assert r.json() == {"n": 1, "path": "/a/x/y", "root": "/a"}
        assert c.get("/a").json()["path"] == "/a"
        r = c.get("/missing")
        assert r.status_code == 404 and "not found" in r.text
        r = c.get("/b")
        assert r.status_code == 500
        assert "Traceback" not in r.text and "do not show" not in r.text
        # ... and the traceback is in the replica's log.
        logs = nbcluster.get_runtime_context().session_dir / "logs"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(
                "RuntimeError: do not show this to the client" in p.read_text(errors="replace")
                for p in logs.glob("worker-*.log")
            ):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the handler's traceback is not in any worker log")
        assert c.get("/-/routes").json() == {"/a": "a", "/b": "b"}
        assert c.get("/-/healthz").text == "success"
        # keep-alive: one connection serves many requests
        for _ in range(20):
            assert c.get("/a/").status_code == 200
    with pytest.raises(ValueError, match="Prefix /a is being used by application 'a'"):
        serve.run(Counter.bind(1), name="other", route_prefix="/a", _display=False)


def test_oversize_body_is_413(serve_cluster: Any, serve_url: str) -> None:
    @serve.deployment(ray_actor_options=NO_CPU)
    class Echo:
        async def __call__(self, request: Any) -> int:
            return len(await request.body())

    serve.run(Echo.bind(), name="echo", route_prefix="/echo", _display=False)
    url = serve_url
    limit = 32 * 1024 * 1024
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/echo", content=b"x" * 1000).json() == 1000
        r = c.post("/echo", content=b"x" * (limit + 1))
        assert r.status_code == 413

        def chunks() -> Any:  # no Content-Length: counted while reading
            for _ in range(33):
                yield b"y" * (1024 * 1024)

        assert c.post("/echo", content=chunks()).status_code == 413
        assert c.post("/echo", content=b"ok").json() == 2  # the proxy is fine


def test_fastapi_ingress(serve_cluster: Any, serve_url: str) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @serve.deployment(ray_actor_options=NO_CPU)
    @serve.ingress(app)
    class Shop:
        def __init__(self) -> None:
            self.items: dict[str, int] = {}

        @app.post("/items")
        def add(self, item: Item) -> dict[str, int]:
            self.items[item.name] = self.items.get(item.name, 0) + item.qty
            return self.items

        @app.get("/items/{name}")
        def get(self, name: str) -> int:
            return self.items.get(name, 0)

    serve.run(Shop.bind(), name="shop", route_prefix="/shop", _display=False)
    with httpx.Client(base_url=serve_url, timeout=30) as c:
        assert c.post("/shop/items", json={"name": "pen", "qty": 2}).json() == {"pen": 2}
        assert c.get("/shop/items/pen").json() == 2
        assert c.post("/shop/items", json={"name": "pen"}).status_code == 422


def test_user_config_reconfigures_in_place_and_code_change_rolls(serve_cluster: Any) -> None:
    @serve.deployment(ray_actor_options=NO_CPU, user_config={"threshold": 1})
    class Model:
        def __init__(self) -> None:
            self.threshold = None

        def reconfigure(self, config: dict[str, int]) -> None:
            self.threshold = config["threshold"]

        def __call__(self) -> tuple[int, Any]:
            return os.getpid(), self.threshold

    handle = serve.run(Model.bind(), name="cfg", route_prefix=None, _display=False)
    pid, threshold = handle.remote().result()
    assert threshold == 1
    handle = serve.run(
        Model.options(user_config={"threshold": 5}).bind(),
        name="cfg",
        route_prefix=None,
        _display=False,
    )
    assert handle.remote().result() == (pid, 5)  # same process: reconfigured in place

    @serve.deployment(ray_actor_options=NO_CPU, user_config={"threshold": 5})
    class Model2(Model.func_or_class):  # type: ignore[name-defined]  # a code change
        def __call__(self) -> tuple[int, Any]:
            return os.getpid(), ("v2", self.threshold)

    handle = serve.run(
        Model2.options(name="Model").bind(), name="cfg", route_prefix=None, _display=False
    )
    new_pid, value = handle.remote().result()
    assert new_pid != pid and value == ("v2", 5)


def test_multiplexed_models_and_batching(serve_cluster: Any, serve_url: str) -> None:
    @serve.deployment(ray_actor_options=NO_CPU, max_ongoing_requests=16)
    class Models:
        def __init__(self) -> None:
            self.batches: list[int] = []

        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> str:
            return f"model-{model_id}"

        async def __call__(self, x: int) -> str:
            model = await self.get_model(serve.get_multiplexed_model_id())
            return f"{model}:{x}"

        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
        async def predict(self, xs: list[int]) -> list[int]:
            self.batches.append(len(xs))
            return [x + 1 for x in xs]

        def sizes(self) -> list[int]:
            return self.batches

    handle = serve.run(Models.bind(), name="mux", route_prefix="/mux", _display=False)
    assert handle.options(multiplexed_model_id="a").remote(1).result() == "model-a:1"
    with httpx.Client(base_url=serve_url, timeout=30) as c:
        r = c.get("/mux", headers={"serve_multiplexed_model_id": "b"})
        assert r.status_code == 200 and r.text.startswith("model-b:")  # the header picks it

    async def burst() -> list[int]:
        return list(await asyncio.gather(*(handle.predict.remote(i) for i in range(16))))

    assert asyncio.run(burst()) == [i + 1 for i in range(16)]
    assert max(handle.sizes.remote().result()) > 1


def test_delete_and_status(serve_cluster: Any, serve_url: str) -> None:
    serve.run(Counter.bind(0), name="gone", route_prefix="/gone", _display=False)
    st = serve.status()
    pid = st.applications["gone"].deployments["Counter"].replicas[0].pid
    assert pid
    serve.delete("gone")
    assert "gone" not in serve.status().applications
    with httpx.Client(base_url=serve_url, timeout=30) as c:
        assert c.get("/gone").status_code == 404
    poll_for(lambda: not pid_alive(pid), 60, message=f"the replica's process {pid} did not exit")
    nbcluster.get(nbcluster.put(1))  # the cluster is fine


def test_live_widget_shows_deployments_replicas_and_traffic(serve_cluster: Any) -> None:
    from nbcluster.serve._widget import ServeWidget

    handle = serve.run(Counter.bind(0), name="widget", route_prefix="/w", _display=False)
    w = ServeWidget("widget", "http://example/w", fetch=serve.status, autostart=False)
    w.refresh()
    assert "Counter" in w.table.value and "RUNNING" in w.table.value
    assert "1 running (target 1)" in w.table.value
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for _ in range(20):
            handle.add.remote().result()
        w.refresh()
        d = w.overview.deployments["Counter"] if w.overview else None
        if d is not None and d.requests_per_s > 0 and d.p50_ms is not None:
            break
    assert d is not None and d.requests_per_s > 0 and d.p99_ms is not None
    assert list(w.figure.data[0].y)[-1] > 0  # requests/s plotted
    text = repr(w)
    assert "Serve application 'widget': RUNNING at http://example/w" in text and "req/s" in text
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "text/plain" in bundle
    serve.delete("widget")
    w.refresh()
    assert "NOT RUNNING" in w.table.value
    w.close()
    assert not w.live
