"""Asyncio parts without processes: long polling, @serve.batch, @serve.multiplexed, the
HTTP conversions, and a replica object driven directly (requests, drain, errors)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from nbcluster import serve
from nbcluster.serve import _http
from nbcluster.serve._context import set_replica
from nbcluster.serve._longpoll import LongPollHost
from nbcluster.serve._replica import REJECTED, Replica, make_spec
from nbcluster.serve._spec import light_config
from nbcluster.serve.config import DeploymentConfig
from nbcluster.serve.exceptions import ServeException


def test_long_poll_returns_newer_snapshots_and_waits_for_changes() -> None:
    async def main() -> None:
        lp = LongPollHost()
        first = await lp.listen({"k": None}, timeout_s=1)
        version, value = first["k"]
        assert value is None  # never published: the deployment does not exist
        assert await lp.listen({"k": version}, timeout_s=0.05) == {}
        waiter = asyncio.create_task(lp.listen({"k": version}, timeout_s=5))
        await asyncio.sleep(0.01)
        assert lp.publish("k", {"replicas": [1]})
        got = await asyncio.wait_for(waiter, 1)
        assert got["k"][1] == {"replicas": [1]}
        assert not lp.publish("k", {"replicas": [1]})  # unchanged: no new version
        other = LongPollHost()  # a restarted controller: a new epoch
        other.publish("k", {"replicas": [2]})
        assert (await other.listen({"k": got["k"][0]}, timeout_s=0))["k"][1] == {"replicas": [2]}

    asyncio.run(main())


def test_batch_collects_calls_into_lists() -> None:
    sizes: list[int] = []

    class Model:
        @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
        async def predict(self, xs: list[int]) -> list[int]:
            sizes.append(len(xs))
            return [x * 10 for x in xs]

    async def main() -> list[int]:
        m = Model()
        return list(await asyncio.gather(*(m.predict(i) for i in range(10))))

    assert asyncio.run(main()) == [i * 10 for i in range(10)]
    assert sizes == [4, 4, 2]


def test_batch_errors_reach_every_caller_and_size_is_checked() -> None:
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=0.01)
    async def bad(xs: list[int]) -> list[int]:
        return [1]

    async def main() -> list[Any]:
        return await asyncio.gather(bad(1), bad(2), return_exceptions=True)

    out = asyncio.run(main())
    assert all(isinstance(e, ServeException) and "preserve batch size" in str(e) for e in out)
    with pytest.raises(TypeError, match="must be 'async def'"):
        serve.batch(lambda xs: xs)
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1"):
        serve.batch(max_batch_size=0)
    with pytest.raises(ValueError, match="batch_wait_timeout_s must be a float >= 0"):
        serve.batch(batch_wait_timeout_s=-1)


def test_multiplexed_caches_models_lru() -> None:
    loads: list[str] = []
    unloaded: list[str] = []

    class Model:
        def __init__(self, mid: str) -> None:
            self.mid = mid

        def __del__(self) -> None:
            unloaded.append(self.mid)

    class Deployment:
        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> Model:
            loads.append(model_id)
            return Model(model_id)

    async def main() -> None:
        d = Deployment()
        a = await d.get_model("a")
        assert await d.get_model("a") is a
        await d.get_model("b")
        await d.get_model("c")  # evicts "a"
        assert "a" in unloaded
        from nbcluster.serve._multiplex import loaded_model_ids

        assert {"b", "c"} <= loaded_model_ids()

    asyncio.run(main())
    assert loads == ["a", "b", "c"]
    with pytest.raises(TypeError, match="'async def'"):
        serve.multiplexed(lambda model_id: model_id)


def test_answer_conversion_matches_ray() -> None:
    assert _http.answer_from_value(None) == (200, [(b"content-type", b"text/plain")], b"")
    assert _http.answer_from_value("hé")[2] == "hé".encode()
    assert _http.answer_from_value(b"raw")[1] == [(b"content-type", b"text/plain")]
    status, headers, body = _http.answer_from_value({"a": [1, 2]})
    assert headers == [(b"content-type", b"application/json")] and json.loads(body) == {"a": [1, 2]}
    assert b"Traceback" not in _http.error_answer(500)[2]


@pytest.fixture
def replica_factory() -> Iterator[Any]:
    yield lambda target, *args, **light: Replica(
        "app",
        "D",
        "r1",
        make_spec(target, args, {}),
        {**light_config(DeploymentConfig.build({})), **light},
    )
    set_replica(None)


def _req(path: str = "/", method: str = "GET", body: bytes = b"") -> _http.HTTPRequest:
    return (method, "http", path, b"q=1", [(b"host", b"x")], body, ("127.0.0.1", 1), "", "1.1")


def test_replica_calls_methods_and_counts(replica_factory: Any) -> None:
    class Adder:
        def __init__(self, k: int) -> None:
            self.k = k

        def add(self, x: int) -> int:
            return x + self.k

        async def slow(self) -> str:
            await asyncio.sleep(0.01)
            return serve.get_multiplexed_model_id()

        def _private(self) -> None:
            pass

    async def main() -> None:
        r = replica_factory(Adder, 5)
        assert serve.get_replica_context().deployment == "D"
        assert await r.handle_request(("add", "", "id1"), 1) == 6
        assert await r.handle_request(("slow", "m7", "id2")) == "m7"
        with pytest.raises(AttributeError, match="has no method 'nope'"):
            await r.handle_request(("nope", "", "id3"))
        with pytest.raises(AttributeError):
            await r.handle_request(("_private", "", "id4"))
        m = await r.get_metrics()
        assert (m["requests"], m["errors"], m["ongoing"], len(m["latencies"])) == (4, 2, 0, 4)

    asyncio.run(main())


def test_replica_http_errors_are_500_without_traceback(replica_factory: Any, capsys: Any) -> None:
    class Api:
        def __call__(self, request: Any) -> Any:
            if request.url.path == "/boom":
                raise RuntimeError("secret detail")
            if request.url.path == "/teapot":
                from starlette.exceptions import HTTPException

                raise HTTPException(418, "short and stout")
            return {"path": request.url.path, "q": request.query_params["q"]}

    async def main() -> None:
        r = replica_factory(Api)
        status, _, body = await r.handle_http(("/", "", "id"), _req("/x"))
        assert status == 200 and json.loads(body) == {"path": "/x", "q": "1"}
        status, _, body = await r.handle_http(("/", "", "id"), _req("/boom"))
        assert status == 500 and b"secret" not in body and b"Traceback" not in body
        assert (await r.handle_http(("/", "", "id"), _req("/teapot")))[0] == 418

    asyncio.run(main())
    assert "RuntimeError: secret detail" in capsys.readouterr().err  # in the replica's log


def test_replica_fastapi_ingress_binds_methods(replica_factory: Any) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @serve.ingress(app)
    class Api:
        def __init__(self, greeting: str) -> None:
            self.greeting = greeting

        @app.get("/hello/{name}")
        def hello(self, name: str, excited: bool = False) -> dict[str, str]:
            return {"msg": f"{self.greeting} {name}{'!' if excited else ''}"}

        @app.post("/echo")
        async def echo(self, payload: dict[str, int]) -> dict[str, int]:
            return {k: v * 2 for k, v in payload.items()}

    async def main() -> None:
        r = replica_factory(Api, "hi")
        assert r._instance.greeting == "hi"
        req = _req("/hello/bob")
        req = (*req[:3], b"excited=true", *req[4:])
        status, _, body = await r.handle_http(("/", "", "id"), req)  # type: ignore[arg-type]
        assert status == 200 and json.loads(body) == {"msg": "hi bob!"}
        post = (
            "POST",
            "http",
            "/echo",
            b"",
            [(b"content-type", b"application/json")],
            b'{"a": 2}',
            None,
            "",
            "1.1",
        )
        status, _, body = await r.handle_http(("/", "", "id"), post)
        assert status == 200 and json.loads(body) == {"a": 4}
        assert (await r.handle_http(("/", "", "id"), _req("/missing")))[0] == 404

    asyncio.run(main())


def test_draining_replica_rejects_new_requests_and_waits_for_ongoing(replica_factory: Any) -> None:
    release = asyncio.Event

    class Slow:
        def __init__(self) -> None:
            self.gate: Any = None

        async def wait(self) -> str:
            await self.gate.wait()
            return "done"

    async def main() -> None:
        r = replica_factory(Slow, graceful_shutdown_wait_loop_s=0.01)
        r._instance.gate = release()
        running = asyncio.create_task(r.handle_request(("wait", "", "a")))
        await asyncio.sleep(0.01)
        drain = asyncio.create_task(r.prepare_for_shutdown())
        await asyncio.sleep(0.3)  # 30 turns of the drain loop: a drain ignoring it would end
        assert await r.handle_request(("wait", "", "b")) is REJECTED
        assert not drain.done()  # one request still ongoing
        r._instance.gate.set()
        assert await running == "done"
        await asyncio.wait_for(drain, 1)

    asyncio.run(main())


def test_widget_html_escapes_and_text_fallback() -> None:
    from nbcluster.serve._widget import render_app, summary_text
    from nbcluster.serve.schema import (
        ApplicationStatus,
        ApplicationStatusOverview,
        DeploymentStatus,
        DeploymentStatusOverview,
        DeploymentStatusTrigger,
        ReplicaDetails,
        ReplicaState,
    )

    d = DeploymentStatusOverview(
        status=DeploymentStatus.HEALTHY,
        status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_COMPLETED,
        replica_states={ReplicaState.RUNNING: 2},
        target_replicas=2,
        replicas=(ReplicaDetails("abc", ReplicaState.RUNNING, "n", "v", pid=7),),
        requests_per_s=12.5,
        p50_ms=1.25,
        p99_ms=9.0,
    )
    app = ApplicationStatusOverview(
        ApplicationStatus.RUNNING, "", 0.0, {"<b>Model</b>": d}, "/", "x"
    )
    page = render_app("<script>", app, "http://h/")
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;Model" in page
    assert "2 running (target 2)" in page and "12.5" in page and "abc RUNNING pid 7" in page
    text = summary_text("m", app, "http://h/")
    assert text.splitlines()[0] == "Serve application 'm': RUNNING at http://h/"
    assert "p50 1.2 ms" in text or "p50 1.3 ms" in text
    assert summary_text("m", None) == "Serve application 'm': not running"


def test_importing_serve_imports_no_widget_or_http_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, nbcluster.serve, nbcluster\n"
        "bad = [m for m in ('ipywidgets', 'plotly', 'uvicorn', 'starlette', 'fastapi') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_watcher_runs_callbacks_on_its_thread_when_the_core_says_ready() -> None:
    import threading

    from nbcluster.serve._watch import Watcher

    subscribed: dict[str, object] = {}

    def subscribe(ref: str, notify: object) -> None:  # the core's when_ready, faked
        subscribed[ref] = notify

    fired: list[tuple[str, str]] = []
    done = threading.Event()
    w = Watcher(subscribe=subscribe)

    def cb(ref: str) -> None:
        fired.append((ref, threading.current_thread().name))
        if len(fired) == 3:
            done.set()

    w.watch("a", cb)
    w.watch("a", cb)  # a second callback on the same ref: one subscription
    w.watch("b", cb)
    assert sorted(subscribed) == ["a", "b"] and w.pending() == 2
    assert fired == []  # nothing runs before the core says so: no polling
    threading.Thread(target=subscribed["a"], args=("a",)).start()  # from another thread
    subscribed["b"]("b")
    assert done.wait(30), fired
    assert sorted(r for r, _ in fired) == ["a", "a", "b"]
    assert {t for _, t in fired} == {"nbcluster-serve-watch"}
    assert w.pending() == 0
