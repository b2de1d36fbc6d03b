"""The Serve controller: a detached actor that makes the running replicas match the apps.

It keeps the declared applications (their deployments' code, config and target replica
counts) and, every 50 ms or when something happens, asks each deployment's state
machine (:mod:`._reconcile`) what to do, and does it: creates replica actors, drains and
kills them, reconfigures them in place. It pulls the replicas' metrics (autoscaling,
statistics), health-checks them, and watches each one with a call that only returns when
the replica dies, so a crash is replaced within milliseconds. It runs one HTTP proxy per
node (:mod:`._proxy`, managed by :mod:`._proxy_manager`). Routing tables reach routers and proxies by long polling
(:mod:`._longpoll`); the controller is never on a request's path.

**Restarts.** The controller is a named detached actor with ``max_restarts=-1``. Its
state is kept in the session directory (``serve/apps.pkl``: applications and their
deployments' code, written on each deploy/delete; ``serve/replicas.json``: the replicas,
written when the set changes). A restarted controller reads both, finds its replicas and
proxies by name, checks they answer, and carries on; requests keep flowing meanwhile,
since routers keep their last tables. (The head's internal KV has no public API yet.)

The actor's methods run on the actor's event loop and hand their work to the
controller's own loop thread (:class:`ControllerCore`), which owns all the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import nbcluster
from nbcluster.exceptions import ActorDiedError
from nbcluster.serve._actors import await_ref, error_text, find_actor, kill, replica_actor_name
from nbcluster.serve._autoscaling import MetricWindow, PolicyState, decide
from nbcluster.serve._client import SERVE_NAMESPACE
from nbcluster.serve._controller_status import serve_status
from nbcluster.serve._controller_store import AppRecord, Key, SavedState
from nbcluster.serve._longpoll import LongPollHost
from nbcluster.serve._metrics import DeploymentStats
from nbcluster.serve._proxy_manager import ProxyManager
from nbcluster.serve._reconcile import (
    DeploymentState,
    Reconfigure,
    ReplicaRecord,
    Start,
    Stop,
    Target,
    app_status,
)
from nbcluster.serve._replica import Replica
from nbcluster.serve._routing import normalize_route_prefix
from nbcluster.serve._spec import AppSpec, DeploymentSpec
from nbcluster.serve.config import HTTPOptions
from nbcluster.serve.schema import (
    ReplicaState,
    ServeStatus,
)

__all__ = ["ControllerCore", "ServeController"]

CONTROL_PERIOD_S = 0.05
METRICS_PERIOD_S = 0.5
PROXY_CHECK_PERIOD_S = 2.0
HEALTH_FAILURE_THRESHOLD = 3


class ControllerCore:
    """All of the controller's state and work, on one event loop (see the module docstring)."""

    def __init__(self, http: HTTPOptions, session_dir: str, node_id: str) -> None:
        self.http = http
        self.dir = Path(session_dir) / "serve"
        self.store = SavedState(self.dir)
        self.node_id = node_id
        self.apps: dict[str, AppRecord] = {}
        self.deps: dict[Key, DeploymentState] = {}
        self.specs: dict[Key, DeploymentSpec] = {}
        self.blobs: dict[str, Any] = {}
        self.handles: dict[str, Any] = {}
        self.creating: dict[str, asyncio.Future[Any]] = {}  # replica id -> its handle, soon
        self.health: dict[str, float] = {}
        self.stats: dict[Key, DeploymentStats] = {}
        self.windows: dict[Key, MetricWindow] = {}
        self.policy: dict[Key, PolicyState] = {}
        self.proxies = ProxyManager(http, node_id, self.dir, self._spawn, self._wake)
        self.lp = LongPollHost()
        self.wake = asyncio.Event()
        self.changed = asyncio.Event()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self._last_metrics = 0.0
        self._last_proxies = 0.0

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Recover from the session directory (after a restart), then run the control loop."""
        self.dir.mkdir(parents=True, exist_ok=True)
        await self._recover()
        self._publish_all()
        self._spawn(self._loop())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _loop(self) -> None:
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), CONTROL_PERIOD_S)
            self.wake.clear()
            try:
                await self._tick(time.monotonic())
            except Exception:  # noqa: BLE001 - keep reconciling; leave a trace in the log
                traceback.print_exc()

    async def _tick(self, now: float) -> None:
        self._autoscale(now)
        for key, ds in list(self.deps.items()):
            spare = await self._spare(key) if self._needs_spare(ds) else 1 << 30
            for action in ds.step(now, spare):
                if isinstance(action, Start):
                    self._spawn(self._start_replica(key, action))
                elif isinstance(action, Stop):
                    self._spawn(self._stop_replica(key, action))
                elif isinstance(action, Reconfigure):
                    self._spawn(self._reconfigure(key, action))
            if ds.gone:
                self._forget_deployment(key)
        for app in list(self.apps.values()):
            if app.deleting and not any((app.name, d) in self.deps for d in app.deployments):
                del self.apps[app.name]
                self._save_apps()
        self._publish_all()
        self._save_replicas()
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        if now - self._last_metrics >= METRICS_PERIOD_S:
            self._last_metrics = now
            self._spawn(self._pull_metrics())
        self._health_checks(now)
        if self.proxies.due or now - self._last_proxies >= PROXY_CHECK_PERIOD_S:
            self._last_proxies = now
            self.proxies.due = False
            self._spawn(self.proxies.ensure())

    # -- deploy / delete ---------------------------------------------------------------------
    def deploy(self, spec: AppSpec) -> None:
        """Declare (or update) an application; replicas follow in the background."""
        prefix = normalize_route_prefix(spec.route_prefix)
        for other in self.apps.values():
            taken = other.name != spec.name and not other.deleting
            if taken and prefix is not None and other.route_prefix == prefix:
                raise ValueError(
                    f"Prefix {prefix} is being used by application {other.name!r}. "
                    "Specify a unique route_prefix (serve.run(app, route_prefix=...))."
                )
        names = [d.name for d in spec.deployments]
        if len(set(names)) != len(names):
            raise ValueError(f"application {spec.name!r} has two deployments with the same name")
        old = self.apps.get(spec.name)
        if old is not None:
            for name in old.deployments:
                if name not in names and (spec.name, name) in self.deps:
                    self.deps[(spec.name, name)].delete()
        now = time.monotonic()
        for d in spec.deployments:
            key = (spec.name, d.name)
            ds = self.deps.get(key)
            if ds is None:
                ds = self.deps[key] = DeploymentState(spec.name, d.name, _new_replica_id)
                self.stats[key] = DeploymentStats()
                self.windows[key] = MetricWindow()
                self.policy[key] = PolicyState()
            prev = ds.target
            config_version = 0
            if prev is not None:
                config_version = prev.config_version
                if self.specs[key].light() != d.light():
                    config_version += 1
            auto = d.config.autoscaling_config
            if auto is not None and prev is not None and self.specs[key].config.autoscaling_config:
                replicas = max(auto.min_replicas, min(auto.max_replicas, prev.num_replicas))
            else:
                replicas = d.config.num_replicas
            ds.set_target(Target(d.version, d.config, config_version, replicas))
            self.specs[key] = d
        self.apps[spec.name] = AppRecord(
            spec.name, prefix, spec.ingress, names, time.time(), deleting=False
        )
        del now
        self._save_apps()
        self._publish_all()
        self.wake.set()

    def delete(self, names: list[str]) -> None:
        """Delete applications (their replicas drain and stop in the background)."""
        for name in names:
            app = self.apps.get(name)
            if app is None:
                continue
            app.deleting = True
            for d in app.deployments:
                if (name, d) in self.deps:
                    self.deps[(name, d)].delete()
        self._save_apps()
        self.wake.set()

    def _forget_deployment(self, key: Key) -> None:
        self.deps.pop(key, None)
        self.specs.pop(key, None)
        self.stats.pop(key, None)
        self.windows.pop(key, None)
        self.policy.pop(key, None)
        self.lp.remove(f"replicas:{key[0]}#{key[1]}")

    async def wait_for_app(self, name: str, timeout_s: float) -> tuple[str, str]:
        """Wait until ``name`` is RUNNING or DEPLOY_FAILED (or gone); its status and message.

        DEPLOY_FAILED is returned only once no replica of a failed version is left (their
        actors are ended), so that nothing of the failed deploy runs when ``serve.run``
        raises.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            status, message = self._app_status(name)
            if status in ("RUNNING", "NOT_STARTED"):
                return status, message
            if status == "DEPLOY_FAILED" and self._failed_replicas_gone(name):
                return status, message
            remaining = deadline - loop.time()
            if remaining <= 0:
                return status, message
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def wait_for_gone(self, names: list[str], timeout_s: float) -> bool:
        """Wait until the applications are deleted; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(n in self.apps for n in names):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    async def wait_for_proxies(self, timeout_s: float) -> dict[str, str]:
        """Wait until the proxies tried so far have started; their URLs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.proxies.ready() and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - loop.time()))
        return self.proxies.urls()

    def _failed_replicas_gone(self, name: str) -> bool:
        app = self.apps.get(name)
        for d in app.deployments if app is not None else ():
            ds = self.deps.get((name, d))
            if ds is not None and ds.failed and ds.has_target_replicas():
                return False
        return True

    def _wake(self) -> None:
        self.wake.set()

    def _app_status(self, name: str) -> tuple[str, str]:
        app = self.apps.get(name)
        if app is None:
            return "NOT_STARTED", f"application {name!r} does not exist"
        statuses = {}
        for d in app.deployments:
            ds = self.deps.get((name, d))
            if ds is not None:
                st, _, msg = ds.status()
                statuses[d] = (st, msg)
        status, message = app_status(statuses, app.deleting)
        return status.value, message

    def app_info(self, name: str) -> dict[str, Any] | None:
        """Ingress deployment and route of an application (None when it does not exist)."""
        app = self.apps.get(name)
        if app is None or app.deleting:
            return None
        return {
            "ingress": app.ingress,
            "route_prefix": app.route_prefix,
            "deployments": list(app.deployments),
        }

    async def shutdown(self) -> None:
        """Delete every application, stop the proxies, remove the saved state."""
        self.delete(list(self.apps))
        await self.wait_for_gone(list(self.apps), 60)
        self.stopping = True
        await self.proxies.shutdown()
        self.store.remove()

    # -- replicas ------------------------------------------------------------------------------
    async def _blob(self, version: str, blob: bytes) -> Any:
        ref = self.blobs.get(version)
        if ref is None:
            ref = self.blobs[version] = await asyncio.to_thread(nbcluster.put, blob)
        return ref

    async def _start_replica(self, key: Key, action: Start) -> None:
        app, name = key
        ds = self.deps[key]
        spec = self.specs[key]
        if spec.version != action.version:
            ds.on_start_failed(
                action.replica_id, "the version changed while starting", time.monotonic()
            )
            return
        rid = action.replica_id
        # A stop that comes while the actor is being created waits for its handle here.
        created: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.creating[rid] = created
        try:
            blob = await self._blob(spec.version, spec.blob)
            opts = dict(spec.config.actor_options())
            actor = nbcluster.remote(Replica).options(
                name=replica_actor_name(app, name, rid),
                namespace=SERVE_NAMESPACE,
                lifetime="detached",
                scheduling_strategy="SPREAD",
                **opts,
            )
            handle = await asyncio.to_thread(actor.remote, app, name, rid, blob, spec.light())
        except Exception as e:  # noqa: BLE001 - e.g. bad actor options: a start failure
            self.creating.pop(rid, None)
            created.set_result(None)
            ds.on_start_failed(rid, f"{type(e).__name__}: {e}", time.monotonic())
            self.wake.set()
            return
        self.creating.pop(rid, None)
        created.set_result(handle)
        if not _still_starting(ds, rid):
            return  # stopped while its actor was created: the stop ends it
        self.handles[rid] = handle
        try:
            info = await await_ref(handle.ready.remote())
        except Exception as e:  # noqa: BLE001 - the constructor (or reconfigure) raised
            ds.on_start_failed(rid, error_text(e), time.monotonic())
            self.handles.pop(rid, None)
            await kill(handle)
            self.wake.set()
            return
        if not _still_starting(ds, rid):
            # Stopped while its constructor ran (a failed deployment, a scale-down, a
            # delete): the stop may have missed it; end it here too.
            self.handles.pop(rid, None)
            await kill(handle)
            self.wake.set()
            return
        ds.on_started(rid, time.monotonic(), info.get("pid"), info.get("node_id"))
        self.health[rid] = time.monotonic()
        self._spawn(self._watch_replica(key, rid, handle))
        self.wake.set()

    async def _watch_replica(self, key: Key, replica_id: str, handle: Any) -> None:
        """Returns when the replica's process is gone; a death of a live replica is replaced."""
        with contextlib.suppress(Exception):
            await await_ref(handle.wait_until_stopped.remote())
        ds = self.deps.get(key)
        if ds is None or replica_id not in ds.replicas:
            return
        record = ds.replicas[replica_id]
        if record.state in (ReplicaState.RUNNING, ReplicaState.UPDATING, ReplicaState.RECOVERING):
            ds.on_died(replica_id, f"replica {replica_id} died")
            self._spawn(self._stop_replica(key, Stop(replica_id, graceful=False)))
            self.wake.set()

    async def _stop_replica(self, key: Key, action: Stop) -> None:
        handle = self.handles.get(action.replica_id)
        creating = self.creating.get(action.replica_id)
        if handle is None and creating is not None:
            handle = await asyncio.shield(creating)  # its actor is being created: end it
        ds = self.deps.get(key)
        if handle is not None:
            if action.graceful and ds is not None:
                timeout = ds.target.config.graceful_shutdown_timeout_s if ds.target else 20.0
                with contextlib.suppress(Exception):
                    await await_ref(handle.prepare_for_shutdown.remote(), timeout + 5)
            await kill(handle)
        self.handles.pop(action.replica_id, None)
        self.health.pop(action.replica_id, None)
        stats = self.stats.get(key)
        if stats is not None:
            stats.forget(action.replica_id)
        if ds is not None:
            ds.on_stopped(action.replica_id)
        self.wake.set()

    async def _reconfigure(self, key: Key, action: Reconfigure) -> None:
        handle = self.handles.get(action.replica_id)
        ds = self.deps.get(key)
        spec = self.specs.get(key)
        if handle is None or ds is None or spec is None:
            return
        try:
            await await_ref(handle.reconfigure.remote(spec.light()))
        except Exception as e:  # noqa: BLE001 - a failing reconfigure replaces the replica
            ds.on_died(action.replica_id, f"reconfigure failed: {error_text(e)}")
            self._spawn(self._stop_replica(key, Stop(action.replica_id, graceful=False)))
        else:
            ds.on_reconfigured(action.replica_id, action.config_version)
        self.wake.set()

    async def report_failure(self, app: str, deployment: str, replica_id: str) -> None:
        """A router saw the replica fail: check it now rather than at the next health check."""
        handle = self.handles.get(replica_id)
        ds = self.deps.get((app, deployment))
        if handle is None or ds is None:
            return
        try:
            await await_ref(handle.get_metrics.remote(), 5)
        except Exception:  # noqa: BLE001 - it is gone
            if replica_id in ds.replicas and ds.replicas[replica_id].state != ReplicaState.STOPPING:
                ds.on_died(replica_id, f"replica {replica_id} died")
                self._spawn(self._stop_replica((app, deployment), Stop(replica_id, graceful=False)))
                self.wake.set()

    def _health_checks(self, now: float) -> None:
        for key, ds in self.deps.items():
            if ds.target is None:
                continue
            period = ds.target.config.health_check_period_s
            for rid, r in ds.replicas.items():
                if r.state != ReplicaState.RUNNING or rid not in self.handles:
                    continue
                if now - self.health.get(rid, now) >= period:
                    self.health[rid] = now + 1e9  # one check at a time
                    self._spawn(self._check(key, rid, ds.target.config.health_check_timeout_s))

    async def _check(self, key: Key, replica_id: str, timeout: float) -> None:
        handle = self.handles.get(replica_id)
        ds = self.deps.get(key)
        if handle is None or ds is None or replica_id not in ds.replicas:
            return
        record = ds.replicas[replica_id]
        try:
            await await_ref(handle.check_health.remote(), timeout)
            record.health_failures = 0
        except Exception as e:  # noqa: BLE001 - unhealthy
            record.health_failures += 1
            if record.health_failures >= HEALTH_FAILURE_THRESHOLD or isinstance(e, ActorDiedError):
                ds.on_died(
                    replica_id, f"replica {replica_id} failed its health check: {error_text(e)}"
                )
                self._spawn(self._stop_replica(key, Stop(replica_id, graceful=False)))
                self.wake.set()
        self.health[replica_id] = time.monotonic()

    async def _pull_metrics(self) -> None:
        async def one(key: Key, rid: str, handle: Any) -> None:
            try:
                metrics = await await_ref(handle.get_metrics.remote(), 5)
            except Exception:  # noqa: BLE001 - the death watch handles dead replicas
                return
            stats = self.stats.get(key)
            ds = self.deps.get(key)
            if stats is not None and ds is not None and rid in ds.replicas:
                stats.report(rid, metrics, time.monotonic())
                ds.replicas[rid].ongoing = float(metrics["ongoing"])

        jobs = []
        for key, ds in self.deps.items():
            for rid, r in ds.replicas.items():
                if r.state in (ReplicaState.RUNNING, ReplicaState.UPDATING) and rid in self.handles:
                    jobs.append(one(key, rid, self.handles[rid]))
        await asyncio.gather(*jobs)
        now = time.monotonic()
        for key, stats in self.stats.items():
            self.windows[key].record(now, stats.total_ongoing())

    def _autoscale(self, now: float) -> None:
        for key, ds in self.deps.items():
            t = ds.target
            if t is None or ds.deleting or ds.failed or t.config.autoscaling_config is None:
                continue
            cfg = t.config.autoscaling_config
            window = self.windows[key]
            avg = window.average(now, cfg.look_back_period_s) if len(window) else None
            running = sum(
                1
                for r in ds.replicas.values()
                if r.state in (ReplicaState.RUNNING, ReplicaState.UPDATING)
            )
            new = decide(
                total_ongoing=avg,
                current=running,
                target=t.num_replicas,
                config=cfg,
                state=self.policy[key],
                now=now,
            )
            if new != t.num_replicas:
                ds.scale_to(new)

    def _needs_spare(self, ds: DeploymentState) -> bool:
        t = ds.target
        if t is None or ds.deleting:
            return False
        return any(
            r.version != t.version and r.state != ReplicaState.STOPPING
            for r in ds.replicas.values()
        )

    async def _spare(self, key: Key) -> int:
        shape = _shape(self.specs[key].config.actor_options())
        if not shape:
            return 1 << 30
        try:
            available = await asyncio.to_thread(nbcluster.available_resources)
        except Exception:  # noqa: BLE001 - unknown: assume no room (replace one by one)
            return 0
        return int(min(available.get(k, 0.0) / v for k, v in shape.items()) + 1e-9)

    # -- publishing and status -----------------------------------------------------------------
    def _publish_all(self) -> None:
        routes = {
            a.route_prefix: a.name
            for a in self.apps.values()
            if a.route_prefix is not None and not a.deleting
        }
        ingress = {a.name: a.ingress for a in self.apps.values() if not a.deleting}
        self.lp.publish("routes", {"routes": routes, "ingress": ingress})
        for key, ds in self.deps.items():
            t = ds.target
            if t is None:
                continue
            replicas = [(rid, self.handles[rid]) for rid in ds.routable() if rid in self.handles]
            stats = self.stats.get(key)
            models = {rid: m for rid, m in (stats.models.items() if stats else ()) if m}
            unavailable = ""
            if ds.failed and not replicas:
                unavailable = "the deployment failed to deploy (see serve.status())"
            elif ds.deleting and not replicas:
                unavailable = "the deployment is being deleted"
            self.lp.publish(
                f"replicas:{key[0]}#{key[1]}",
                {
                    "replicas": replicas,
                    "max_ongoing_requests": t.config.max_ongoing_requests,
                    "max_queued_requests": t.config.max_queued_requests,
                    "models": models,
                    "unavailable": unavailable,
                },
            )

    def status(self) -> ServeStatus:
        """What ``serve.status()`` returns."""
        return serve_status(self.apps.values(), self.deps, self.stats, self.proxies)

    # -- persistence ---------------------------------------------------------------------------
    def _save_apps(self) -> None:
        if self.stopping:
            return
        deployments = [
            (key, self.specs[key], ds.target, ds.deleting)
            for key, ds in self.deps.items()
            if key in self.specs
        ]
        self.store.save_apps(self.apps.values(), deployments)

    def _save_replicas(self) -> None:
        if not self.stopping:
            self.store.save_replicas(self.deps)

    async def _recover(self) -> None:
        state = self.store.load_apps()
        if state is None:
            return
        now = time.monotonic()
        for a in state["apps"]:
            self.apps[a["name"]] = AppRecord(**a)
        for key, spec, target, deleting in state["deployments"]:
            key = tuple(key)
            ds = self.deps[key] = DeploymentState(key[0], key[1], _new_replica_id)
            ds.set_target(target)
            if deleting:
                ds.delete()
            self.specs[key] = spec
            self.stats[key] = DeploymentStats()
            self.windows[key] = MetricWindow()
            self.policy[key] = PolicyState()
        records = self.store.load_replicas()
        jobs = []
        for k, rows in records.items():
            app, _, name = k.partition("#")
            ds = self.deps.get((app, name))
            if ds is None:
                continue
            for rid, version, config_version in rows:
                ds.adopt(ReplicaRecord(rid, version, ReplicaState.RECOVERING, config_version, now))
                jobs.append(self._recover_replica((app, name), rid))
        await asyncio.gather(*jobs)

    async def _recover_replica(self, key: Key, replica_id: str) -> None:
        ds = self.deps[key]
        handle = await asyncio.to_thread(find_actor, replica_actor_name(key[0], key[1], replica_id))
        alive = False
        info: dict[str, Any] = {}
        if handle is not None:
            try:
                info = await await_ref(handle.info.remote(), 10)
                alive = True
            except Exception:  # noqa: BLE001 - not answering: replaced
                await kill(handle)
        if alive:
            self.handles[replica_id] = handle
            self.health[replica_id] = time.monotonic()
            self._spawn(self._watch_replica(key, replica_id, handle))
        ds.on_recovered(replica_id, alive, time.monotonic())
        if alive and replica_id in ds.replicas:
            ds.replicas[replica_id].pid = info.get("pid")
            ds.replicas[replica_id].node_id = info.get("node_id")


def _still_starting(ds: DeploymentState, replica_id: str) -> bool:
    record = ds.replicas.get(replica_id)
    return record is not None and record.state == ReplicaState.STARTING


def _new_replica_id() -> str:
    return uuid.uuid4().hex[:8]


def _shape(options: dict[str, Any]) -> dict[str, float]:
    shape = {
        "CPU": float(options.get("num_cpus", 0) or 0),
        "GPU": float(options.get("num_gpus", 0) or 0),
    }
    shape.update({k: float(v) for k, v in (options.get("resources") or {}).items()})
    return {k: v for k, v in shape.items() if v > 0}


class ServeController:
    """The controller actor: a thin shell over :class:`ControllerCore` on its own loop."""

    def __init__(self, http_options: HTTPOptions) -> None:
        ctx = nbcluster.get_runtime_context()
        self._loop = asyncio.new_event_loop()
        threading.Thread(
            target=self._loop.run_forever, name="serve-controller", daemon=True
        ).start()

        async def make() -> ControllerCore:
            core = ControllerCore(http_options, str(ctx.session_dir), ctx.get_node_id())
            await core.start()
            return core

        self._core = asyncio.run_coroutine_threadsafe(make(), self._loop).result(120)

    async def _on_core(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _call(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)

        return await self._on_core(run())

    async def ready(self) -> dict[str, Any]:
        """The HTTP options in force (the first ``serve.start`` sets them)."""
        return {"http_options": self._core.http}

    async def deploy_application(self, spec: AppSpec) -> None:
        """Declare or update an application (returns once recorded, not once running)."""
        await self._call(self._core.deploy, spec)

    async def wait_for_application(self, name: str, timeout_s: float) -> tuple[str, str]:
        """Status and message once ``name`` is RUNNING or DEPLOY_FAILED (or at the timeout)."""
        return await self._on_core(self._core.wait_for_app(name, timeout_s))  # type: ignore[no-any-return]

    async def delete_applications(self, names: list[str], wait_s: float) -> bool:
        """Delete applications; wait up to ``wait_s`` for them to be gone."""
        await self._call(self._core.delete, names)
        return await self._on_core(self._core.wait_for_gone(names, wait_s))  # type: ignore[no-any-return]

    async def wait_for_proxies(self, timeout_s: float) -> dict[str, str]:
        """Wait for the proxies to start; their URLs by node id."""
        return await self._on_core(self._core.wait_for_proxies(timeout_s))  # type: ignore[no-any-return]

    async def get_status(self) -> ServeStatus:
        """Applications, deployments, replicas and proxies."""
        return await self._call(self._core.status)  # type: ignore[no-any-return]

    async def get_app_info(self, name: str) -> dict[str, Any] | None:
        """Ingress and route of an application."""
        return await self._call(self._core.app_info, name)  # type: ignore[no-any-return]

    async def listen_for_change(self, known: dict[str, Any]) -> dict[str, Any]:
        """Long poll for routing tables (see ``_longpoll``)."""
        return await self._on_core(self._core.lp.listen(known))  # type: ignore[no-any-return]

    async def report_replica_failure(self, app: str, deployment: str, replica_id: str) -> None:
        """A router saw a replica fail."""
        await self._on_core(self._core.report_failure(app, deployment, replica_id))

    async def graceful_shutdown(self) -> None:
        """Stop everything Serve runs (the caller then kills this actor)."""
        await self._on_core(self._core.shutdown())
