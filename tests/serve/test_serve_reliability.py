"""Serve under failure and load (RELIABILITY.md): constructor errors, crashed replicas,
a restarted controller, rolling redeploys and scale-down under traffic, autoscaling, a
bounded load test with flat memory, and a shutdown that leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import httpx
import psutil
import pytest

import nbcluster
from nbcluster import serve
from nbcluster.exceptions import ActorDiedError
from nbcluster.serve._loadgen import LoadResult, run_load
from nbcluster.testing import pid_alive
from nbcluster.util.state import list_actors

pytestmark = pytest.mark.integration
NO_CPU = {"num_cpus": 0}
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def replica_pids(app: str, deployment: str) -> list[int]:
    st = serve.status().applications.get(app)
    if st is None:
        return []
    return [r.pid for r in st.deployments[deployment].replicas if r.state == "RUNNING" and r.pid]


class Background:
    """HTTP load on another thread until stopped; every answer counted."""

    def __init__(self, url: str, concurrency: int = 4) -> None:
        self.result = LoadResult()
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(url, concurrency), daemon=True)
        self._thread.start()

    def _run(self, url: str, concurrency: int) -> None:
        while not self._stop:
            self.result.merge(run_load(url, 40, concurrency, timeout_s=30))

    def stop(self) -> LoadResult:
        self._stop = True
        self._thread.join(60)
        return self.result

    def wait_for_more(self, n: int = 40) -> None:
        """Wait until ``n`` more requests were answered: the load runs at this point."""
        target = self.result.answered + n
        wait_for(lambda: self.result.answered >= target, what=f"{n} more answered requests")


def started(marks: Any, n: int) -> None:
    """Wait until ``n`` calls have written their line to ``marks`` (they are in flight)."""
    wait_for(
        lambda: marks.exists() and len(marks.read_text().splitlines()) >= n,
        what=f"{n} calls in flight",
    )


def _mark(path: str) -> None:
    """A call's first line: one line in ``path`` (the test waits for them)."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def test_constructor_error_fails_run_with_the_traceback_and_leaves_nothing(
    serve_cluster: Any,
) -> None:
    @serve.deployment(ray_actor_options=NO_CPU, num_replicas=2)
    class Broken:
        def __init__(self) -> None:
            raise ValueError("cannot read the weights file")

    with pytest.raises(RuntimeError) as info:
        serve.run(Broken.bind(), name="broken", route_prefix="/broken", _display=False)
    text = str(info.value)
    assert text.startswith("Deploying application broken failed")
    assert "Traceback" in text and "ValueError: cannot read the weights file" in text
    # When run raises, nothing of the failed deployment is left: no replica in the status
    # (the second replica may still have been starting when the first one failed), and no
    # replica actor alive.
    st = serve.status().applications["broken"]
    assert st.status == "DEPLOY_FAILED"
    assert st.deployments["Broken"].status == "DEPLOY_FAILED"
    assert st.deployments["Broken"].replicas == ()
    replicas = [a for a in list_actors() if a.name.startswith("SERVE_REPLICA::broken#Broken#")]
    assert len(replicas) >= 3  # each start attempt was an actor (the check sees real names)
    assert [(a.name, a.state) for a in replicas if a.state != "DEAD"] == []
    # A fixed version deploys over the failed one.

    @serve.deployment(ray_actor_options=NO_CPU, name="Broken")
    class Fixed:
        def __call__(self) -> str:
            return "ok"

    assert (
        serve.run(Fixed.bind(), name="broken", route_prefix=None, _display=False).remote().result()
        == "ok"
    )


def test_a_failed_deploy_ends_the_replica_still_starting_before_run_raises(
    serve_cluster: Any, tmp_path: Any
) -> None:
    # Of two replicas, the first one's constructor is slow; every other one raises at
    # once. The deployment fails while the slow one is still starting: serve.run must
    # not raise before that replica is ended too.
    slow_flag = str(tmp_path / "slow")

    @serve.deployment(ray_actor_options=NO_CPU, num_replicas=2)
    class HalfSlow:
        def __init__(self) -> None:
            try:
                os.close(os.open(slow_flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                raise ValueError("bad weights") from None
            time.sleep(60)  # the slow one: still starting when the deployment fails

    with pytest.raises(RuntimeError, match=r"^Deploying application halfslow failed"):
        serve.run(HalfSlow.bind(), name="halfslow", route_prefix=None, _display=False)
    st = serve.status().applications["halfslow"]
    assert st.status == "DEPLOY_FAILED" and st.deployments["HalfSlow"].replicas == ()
    replicas = [a for a in list_actors() if a.name.startswith("SERVE_REPLICA::halfslow#")]
    assert os.path.exists(slow_flag) and len(replicas) >= 3
    assert [(a.name, a.state) for a in replicas if a.state != "DEAD"] == []


def test_crashed_replica_is_replaced_and_only_its_requests_fail(
    serve_cluster: Any, serve_url: str, tmp_path: Any
) -> None:
    marks = tmp_path / "marks"

    @serve.deployment(ray_actor_options=NO_CPU, num_replicas=2, max_ongoing_requests=50)
    class Worker:
        async def __call__(self, request: Any) -> int:
            delay = float(request.query_params.get("sleep", 0))
            if delay:
                _mark(str(marks))
                await asyncio.sleep(delay)
            return os.getpid()

        async def hold(self, s: float) -> int:
            _mark(str(marks))
            await asyncio.sleep(s)
            return os.getpid()

    handle = serve.run(Worker.bind(), name="crash", route_prefix="/crash", _display=False)
    victim, survivor = replica_pids("crash", "Worker")
    slow = [handle.hold.remote(10) for _ in range(8)]  # spread over both replicas
    slow_http: list[httpx.Response] = []

    def slow_get() -> None:
        with httpx.Client(timeout=120) as c:
            slow_http.append(c.get(f"{serve_url}/crash?sleep=10"))

    http_threads = [threading.Thread(target=slow_get) for _ in range(4)]
    for t in http_threads:
        t.start()
    load = Background(f"{serve_url}/crash")
    started(marks, 12)  # every slow call is in flight on a replica
    load.wait_for_more()
    os.kill(victim, signal.SIGKILL)
    died = 0
    for r in slow:
        try:
            r.result(timeout_s=120)
        except ActorDiedError:
            died += 1
    assert 1 <= died <= 7  # the ones on the killed replica, and only those
    for t in http_threads:
        t.join(timeout=120)
    # Replaced: two running replicas again, the survivor untouched.
    pids = wait_for(
        lambda: (p := replica_pids("crash", "Worker")) and len(p) == 2 and victim not in p and p,
        what="a replacement replica",
    )
    assert survivor in pids
    during = load.stop()
    assert during.errors == 0
    assert set(during.statuses) <= {200, 500}  # a failure is a clean 500 (on the dead replica)
    for r in slow_http:
        assert r.status_code in (200, 500)
        if r.status_code == 500:
            assert "replica handling this request died" in r.text and "Traceback" not in r.text
    # From now on no request fails.
    after = run_load(f"{serve_url}/crash", 300, 8, timeout_s=60)
    assert after.statuses == {200: 300} and after.errors == 0


def test_failing_health_check_replaces_the_replica(serve_cluster: Any) -> None:
    @serve.deployment(ray_actor_options=NO_CPU, health_check_period_s=0.1, health_check_timeout_s=2)
    class Flaky:
        def __init__(self) -> None:
            self.sick = False

        def check_health(self) -> None:
            if self.sick:
                raise RuntimeError("lost the GPU")

        def make_sick(self) -> int:
            self.sick = True
            return os.getpid()

        def __call__(self) -> int:
            return os.getpid()

    handle = serve.run(Flaky.bind(), name="flaky", route_prefix=None, _display=False)
    sick = handle.make_sick.remote().result()
    new = wait_for(
        lambda: (p := replica_pids("flaky", "Flaky")) and sick not in p and p,
        what="the unhealthy replica to be replaced",
    )
    assert handle.remote().result() == new[0]


def test_controller_restart_keeps_serving_and_state(serve_cluster: Any, serve_url: str) -> None:
    @serve.deployment(ray_actor_options=NO_CPU, num_replicas=2, user_config={"v": 1})
    class Keeper:
        def reconfigure(self, config: dict[str, int]) -> None:
            self.v = config["v"]

        def __call__(self, request: Any = None) -> int:
            return self.v

    handle = serve.run(Keeper.bind(), name="keep", route_prefix="/keep", _display=False)
    pids = sorted(replica_pids("keep", "Keeper"))
    load = Background(f"{serve_url}/keep")
    controller = nbcluster.get_actor("SERVE_CONTROLLER", namespace="serve")
    nbcluster.kill(controller, no_restart=False)
    # Requests keep working while the controller restarts.
    assert [handle.remote().result(timeout_s=30) for _ in range(20)] == [1] * 20
    wait_for(lambda: sorted(replica_pids("keep", "Keeper")) == pids, what="replicas adopted")
    during = load.stop()
    assert during.answered > 0 and set(during.statuses) == {200} and during.errors == 0
    st = serve.status().applications["keep"]
    assert st.status == "RUNNING" and st.route_prefix == "/keep"
    # The restarted controller still manages the app: an in-place update reaches the replicas.
    serve.run(
        Keeper.options(user_config={"v": 2}).bind(),
        name="keep",
        route_prefix="/keep",
        _display=False,
    )
    assert handle.remote().result() == 2
    assert sorted(replica_pids("keep", "Keeper")) == pids


def test_rolling_redeploy_and_scale_down_under_load_fail_nothing(
    serve_cluster: Any, serve_url: str
) -> None:
    def make(version: str, replicas: int) -> Any:
        @serve.deployment(ray_actor_options=NO_CPU, num_replicas=replicas, name="Model")
        class Model:
            async def __call__(self, request: Any) -> str:
                await asyncio.sleep(0.005)
                return version

        return Model

    serve.run(make("v1", 2).bind(), name="roll", route_prefix="/roll", _display=False)
    old = replica_pids("roll", "Model")
    load = Background(f"{serve_url}/roll", concurrency=8)
    load.wait_for_more()  # the load runs before, during and after each change
    serve.run(make("v2", 2).bind(), name="roll", route_prefix="/roll", _display=False)
    assert not set(replica_pids("roll", "Model")) & set(old)
    load.wait_for_more()
    serve.run(make("v2", 1).bind(), name="roll", route_prefix="/roll", _display=False)
    load.wait_for_more()
    result = load.stop()
    assert result.errors == 0 and set(result.statuses) == {200}, result.statuses
    with httpx.Client(timeout=30) as c:
        assert c.get(f"{serve_url}/roll").text == "v2"
    wait_for(lambda: len(serve.status().applications["roll"].deployments["Model"].replicas) == 1)


def test_redeploy_without_room_for_both_versions_fails_nothing(
    serve_cluster: Any, serve_url: str
) -> None:
    """2 replicas of 1 CPU each on the 2-CPU cluster: no room to start the new version
    beside the old one, so replicas are replaced one at a time; the other keeps serving."""

    def make(version: str) -> Any:
        @serve.deployment(ray_actor_options={"num_cpus": 1}, num_replicas=2, name="Tight")
        class Tight:
            def __call__(self, request: Any) -> str:
                return version

        return Tight

    serve.run(make("v1").bind(), name="tight", route_prefix="/tight", _display=False)
    load = Background(f"{serve_url}/tight", concurrency=4)
    load.wait_for_more()  # the load runs before, during and after the redeploy
    serve.run(make("v2").bind(), name="tight", route_prefix="/tight", _display=False)
    load.wait_for_more()
    result = load.stop()
    assert result.errors == 0 and set(result.statuses) == {200}, result.statuses
    with httpx.Client(timeout=30) as c:
        assert {c.get(f"{serve_url}/tight").text for _ in range(10)} == {"v2"}


def test_scale_down_drains_in_flight_requests(serve_cluster: Any, tmp_path: Any) -> None:
    marks = tmp_path / "marks"

    @serve.deployment(ray_actor_options=NO_CPU, num_replicas=3, name="Slow")
    class Slow:
        async def __call__(self, s: float) -> tuple[str, int]:
            _mark(str(marks))
            await asyncio.sleep(s)
            return "done", os.getpid()

    handle = serve.run(Slow.bind(), name="drain", route_prefix=None, _display=False)
    pids = set(replica_pids("drain", "Slow"))
    pending = [handle.remote(2.0) for _ in range(9)]
    started(marks, 9)  # all in flight on the replicas when the scale-down comes
    serve.run(Slow.options(num_replicas=1).bind(), name="drain", route_prefix=None, _display=False)
    results = [r.result(timeout_s=60) for r in pending]
    assert [r[0] for r in results] == ["done"] * 9
    kept = wait_for(lambda: (p := replica_pids("drain", "Slow")) and len(p) == 1 and p)
    removed = pids - set(kept)
    assert {pid for _, pid in results} & removed  # removed replicas finished their requests


def test_autoscaling_follows_load(serve_cluster: Any) -> None:
    @serve.deployment(
        ray_actor_options=NO_CPU,
        max_ongoing_requests=20,
        autoscaling_config={
            "min_replicas": 1,
            "max_replicas": 3,
            "target_ongoing_requests": 2,
            "upscale_delay_s": 0.5,
            "downscale_delay_s": 1.0,
            "look_back_period_s": 1.0,
        },
    )
    class Busy:
        async def __call__(self) -> None:
            await asyncio.sleep(0.2)

    handle = serve.run(Busy.bind(), name="auto", route_prefix=None, _display=False)
    assert len(replica_pids("auto", "Busy")) == 1

    def replicas_now() -> int:
        return serve.status().applications["auto"].deployments["Busy"].target_replicas

    deadline = time.monotonic() + 90
    while replicas_now() < 3 and time.monotonic() < deadline:
        responses = [handle.remote() for _ in range(12)]
        for r in responses:
            r.result(timeout_s=30)
    assert replicas_now() == 3
    wait_for(lambda: len(replica_pids("auto", "Busy")) == 3, what="3 replicas running")
    wait_for(lambda: replicas_now() == 1, what="scale back to 1")
    wait_for(lambda: len(replica_pids("auto", "Busy")) == 1, what="1 replica running")
    assert serve.status().applications["auto"].deployments["Busy"].status_trigger in (
        "DOWNSCALE_COMPLETED",
        "AUTOSCALING",
    )


def test_load_test_answers_every_request_with_flat_memory(
    serve_cluster: Any, serve_url: str
) -> None:
    """CI size: 2 × 2,000 requests from 32 connections. `benchmarks/serve_bench.py --load`
    runs the full 20,000."""

    @serve.deployment(ray_actor_options=NO_CPU, num_replicas=2, max_ongoing_requests=32)
    def noop(request: Any) -> str:
        return "ok"

    serve.run(noop.bind(), name="load", route_prefix="/load", _display=False)
    st = serve.status()
    pids = [*replica_pids("load", "noop"), *st.proxy_pids.values()]

    def rss() -> int:
        return sum(psutil.Process(p).memory_info().rss for p in pids)

    warm = run_load(f"{serve_url}/load", 2000, 32, timeout_s=120)
    assert warm.statuses == {200: 2000} and warm.errors == 0
    before = rss()
    run = run_load(f"{serve_url}/load", 2000, 32, timeout_s=120)
    assert run.statuses == {200: 2000} and run.errors == 0
    growth = rss() - before
    assert growth < 16 * 1024 * 1024, f"memory grew by {growth / 2**20:.1f} MiB"
    assert serve.status().applications["load"].deployments["noop"].errors == 0


def test_shutdown_leaves_no_serve_actor(serve_cluster: Any) -> None:
    @serve.deployment(ray_actor_options=NO_CPU)
    def f() -> int:
        return os.getpid()

    pid = serve.run(f.bind(), name="last", route_prefix="/last", _display=False).remote().result()
    proxy_pids = list(serve.status().proxy_pids.values())
    serve.shutdown()
    with pytest.raises(ValueError):
        nbcluster.get_actor("SERVE_CONTROLLER", namespace="serve")
    for p in [pid, *proxy_pids]:
        wait_for(lambda p=p: not pid_alive(p), what=f"process {p} to exit")
    assert serve.status().applications == {}
    serve.start(http_options={"port": 0})  # the module fixture's Serve, again
