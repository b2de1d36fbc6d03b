"""The controller's HTTP proxies: one per node (``EveryNode``) or on its own node
(``HeadOnly``), started, watched (a proxy that dies is started again) and listed in
``<session dir>/serve/proxies.json`` for the Jupyter server extension and the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbcluster
from nbcluster.serve._actors import await_ref, find_actor, kill
from nbcluster.serve._client import SERVE_NAMESPACE
from nbcluster.serve._proxy import ProxyActor
from nbcluster.serve.config import HTTPOptions, ProxyLocation
from nbcluster.serve.schema import ProxyStatus
from nbcluster.util import NodeAffinitySchedulingStrategy

__all__ = ["ProxyManager"]


class ProxyManager:
    """The proxies of one controller (runs on the controller's event loop)."""

    def __init__(
        self,
        http: HTTPOptions,
        node_id: str,
        directory: Path,
        spawn: Callable[[Any], Any],
        changed: Callable[[], None],
    ) -> None:
        self.http = http
        self.node_id = node_id
        self.dir = directory
        self._spawn = spawn
        self._changed = changed
        self.proxies: dict[str, dict[str, Any]] = {}
        self.stopping = False
        self.due = True  # check at the next tick

    @property
    def enabled(self) -> bool:
        """False when HTTP is off (``host=None`` or ``proxy_location="Disabled"``)."""
        return self.http.host is not None and self.http.location != ProxyLocation.Disabled

    def ready(self) -> bool:
        """True once every proxy tried so far has started (or HTTP is off)."""
        if not self.enabled:
            return True
        return bool(self.proxies) and all(
            p["status"] != ProxyStatus.STARTING for p in self.proxies.values()
        )

    def urls(self) -> dict[str, str]:
        """URL of each proxy, by node id."""
        return {n: p["url"] for n, p in self.proxies.items() if p["url"]}

    def pids(self) -> dict[str, int]:
        """Process id of each proxy, by node id."""
        return {n: p["pid"] for n, p in self.proxies.items() if p.get("pid")}

    def statuses(self) -> dict[str, ProxyStatus]:
        """State of each proxy, by node id."""
        return {n: p["status"] for n, p in self.proxies.items()}

    async def ensure(self) -> None:
        """Start the proxies that should run and do not; drop those of dead nodes."""
        self.due = False
        location = self.http.location or ProxyLocation.EveryNode
        if self.stopping or not self.enabled:
            return
        if location == ProxyLocation.HeadOnly:
            wanted = {self.node_id}
        else:
            try:
                nodes = await asyncio.to_thread(nbcluster.nodes)
            except Exception:  # noqa: BLE001 - try again at the next check
                return
            wanted = {n["NodeID"] for n in nodes if n["Alive"]}
        for node_id in list(self.proxies):
            if node_id not in wanted:
                await kill(self.proxies.pop(node_id)["handle"])
        started = [self._start(n) for n in wanted if n not in self.proxies]
        if started:
            await asyncio.gather(*started)
            self.save()

    async def _start(self, node_id: str) -> None:
        name = f"SERVE_PROXY::{node_id}"
        self.proxies[node_id] = {"handle": None, "url": "", "status": ProxyStatus.STARTING}
        try:
            handle = await asyncio.to_thread(find_actor, name)
            if handle is None:
                actor = nbcluster.remote(ProxyActor).options(
                    name=name,
                    namespace=SERVE_NAMESPACE,
                    lifetime="detached",
                    num_cpus=0,
                    get_if_exists=True,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                handle = await asyncio.to_thread(actor.remote, self.http)
            info = await await_ref(handle.ready.remote(), 60)
        except Exception:  # noqa: BLE001 - retried at the next check
            traceback.print_exc()
            self.proxies.pop(node_id, None)
            return
        self.proxies[node_id] = {
            "handle": handle,
            "url": info["url"],
            "pid": info["pid"],
            "status": ProxyStatus.HEALTHY,
        }
        self._spawn(self._watch(node_id, handle))
        self._changed()

    async def _watch(self, node_id: str, handle: Any) -> None:
        with contextlib.suppress(Exception):
            await await_ref(handle.wait_until_stopped.remote())
        if not self.stopping and self.proxies.get(node_id, {}).get("handle") == handle:
            self.proxies.pop(node_id, None)
            self.due = True  # start it again now
            self.save()
            self._changed()

    def save(self) -> None:
        """Write ``proxies.json`` (atomically)."""
        urls = [{"node_id": n, "url": p["url"]} for n, p in self.proxies.items() if p["url"]]
        path = self.dir / "proxies.json"
        tmp = path.with_name(f".proxies.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(urls))
        os.replace(tmp, path)

    async def shutdown(self) -> None:
        """Stop every proxy (finishing the requests in flight)."""
        self.stopping = True
        for node_id, proxy in list(self.proxies.items()):
            with contextlib.suppress(Exception):
                await await_ref(proxy["handle"].prepare_for_shutdown.remote(), 5)
            await kill(proxy["handle"])
            self.proxies.pop(node_id, None)
