"""The JSON the server extension sends and accepts, typed, plus strict request parsing.

Every ``TypedDict`` here has a TypeScript twin in ``labextension/src/models.ts`` with the
same name prefixed by ``I`` and the same keys (``tests/jupyter_server/test_models_mirror.py``
compares them). Request bodies are parsed by the ``parse_*`` functions, which accept
exactly the documented keys with exactly the documented types and raise
:class:`BadRequest` with a message saying what to send instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

__all__ = [
    "ADDRESS_RE",
    "CLUSTER_ID_RE",
    "AddressRequest",
    "BadRequest",
    "ClusterListModel",
    "ClusterModel",
    "ConnectCodeModel",
    "ErrorModel",
    "Limits",
    "LoadModel",
    "Origin",
    "ScaleRequest",
    "ScalingEventModel",
    "StartRequest",
    "UpdatesModel",
    "parse_updates_query",
    "connect_code",
    "parse_address_request",
    "parse_scale_request",
    "parse_start_request",
    "valid_address",
    "valid_cluster_id",
]

#: Where a cluster in the list comes from: started from the panel of this server, started
#: by a kernel of this server, started by another process on this host, or an address
#: the user added.
Origin = Literal["panel", "kernel", "host", "address"]

#: Cluster ids are 12 lowercase hex digits (a hash of the session directory or address).
CLUSTER_ID_RE = re.compile(r"[0-9a-f]{12}")

#: ``host:port`` of a head: a DNS name or IPv4 address, or an IPv6 address in brackets.
#: Nothing else (no spaces, quotes, newlines or shell/magic syntax) can pass, which is
#: what makes the connect code built from it safe to insert and run.
ADDRESS_RE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}"
)


class ClusterModel(TypedDict):
    """One cluster in the sidebar (``GET /nbcluster/api/clusters[/<id>]``)."""

    id: str
    address: str
    origin: Origin
    #: Live node managers; None when unknown (an added address).
    nodes: int | None
    #: CPUs per node as requested from the panel; None when not started here.
    num_cpus: int | None
    #: The session directory on this host; None for an added address.
    session_dir: str | None
    #: The kernel of this server that started the cluster (origin "kernel").
    kernel_id: str | None
    #: PID of the process that started the cluster, when it is still alive.
    owner_pid: int | None
    can_scale: bool
    can_stop: bool
    #: The entry is an added address: DELETE only removes it from the list.
    can_forget: bool


class ClusterListModel(TypedDict):
    """``GET /nbcluster/api/clusters``."""

    clusters: list[ClusterModel]


class ScalingEventModel(TypedDict):
    """One autoscaler event in a :class:`LoadModel` (launch, joined, removed, ...)."""

    #: Seconds since the epoch.
    time: float
    kind: str
    message: str


class LoadModel(TypedDict):
    """``GET /nbcluster/api/clusters/<id>/load``: the cluster's load right now.

    ``source`` is ``"head"`` when the numbers were read from the cluster's head, and
    ``"none"`` for a cluster this server does not ask (an address the user added). Numbers
    the head does not report are None.
    """

    cluster_id: str
    address: str
    source: Literal["head", "none"]
    nodes: int | None
    cpu_used: float | None
    cpu_total: float | None
    gpu_used: float | None
    gpu_total: float | None
    store_used: int | None
    store_capacity: int | None
    tasks_running: int | None
    tasks_queued: int | None
    #: Seconds since the epoch when the numbers were read.
    time: float
    #: The autoscaler in one line ("autoscaler (local): 2 running, ..."); None without one.
    autoscaler: str | None
    #: Its latest events, oldest first (at most 5).
    scaling_events: list[ScalingEventModel]


class UpdatesModel(TypedDict):
    """``GET /nbcluster/api/updates?after=N``: the list and every load, once they changed.

    ``version`` increases with every change; the next request passes it as ``after``
    and is answered when something changed after it (or at its timeout, unchanged).
    ``loads`` has one entry per cluster on this host whose head pushed its state.
    """

    version: int
    clusters: list[ClusterModel]
    loads: list[LoadModel]


class ConnectCodeModel(TypedDict):
    """``POST /nbcluster/api/clusters/<id>/connect-code``: what to run in a kernel."""

    cluster_id: str
    address: str
    code: str


class ErrorModel(TypedDict):
    """The body of every error response (never a traceback)."""

    message: str


class StartRequest(TypedDict):
    """``POST /nbcluster/api/clusters``."""

    num_cpus: int
    nodes: int


class ScaleRequest(TypedDict):
    """``PATCH /nbcluster/api/clusters/<id>``."""

    nodes: int


class AddressRequest(TypedDict):
    """``POST /nbcluster/api/addresses``."""

    address: str


class BadRequest(ValueError):
    """A request body that does not match its model; the message says what to send."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what the panel may ask for (configurable on the server extension)."""

    max_cpus: int = 256
    max_nodes: int = 16


def valid_cluster_id(text: str) -> bool:
    """True when ``text`` has the shape of a cluster id (anchored match)."""
    return CLUSTER_ID_RE.fullmatch(text) is not None


def valid_address(text: str) -> bool:
    """True for ``host:port`` with a port in 1..65535 (anchored match)."""
    if len(text) > 300 or ADDRESS_RE.fullmatch(text) is None:
        return False
    return 1 <= int(text.rsplit(":", 1)[1]) <= 65535


def connect_code(address: str) -> str:
    """The cell that attaches a kernel to the cluster at ``address``."""
    if not valid_address(address):
        raise ValueError(f"not a cluster address: {address!r}")
    return f"%load_ext nbcluster\n%cluster connect {address}"


def _object(body: Any, keys: tuple[str, ...], example: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object like {example}")
    missing = [k for k in keys if k not in body]
    extra = sorted(str(k) for k in body if k not in keys)
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(repr(k) for k in missing))
        if extra:
            parts.append("unexpected " + ", ".join(repr(k) for k in extra[:5]))
        raise BadRequest(f"{'; '.join(parts)}: send exactly {example}")
    return body


def _int_in(body: dict[str, Any], key: str, low: int, high: int) -> int:
    value = body[key]
    if type(value) is not int:  # bool is an int subclass; floats and strings are refused
        raise BadRequest(f"{key!r} must be a whole number from {low} to {high}, got {value!r:.40}")
    if not low <= value <= high:
        raise BadRequest(f"{key!r} must be from {low} to {high}, got {value}")
    return value


#: The longest a long poll may wait (seconds), and what it waits when not told.
MAX_WAIT_S = 60.0
DEFAULT_WAIT_S = 25.0
_UINT = re.compile(r"[0-9]{1,15}")
_SECONDS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3})?")


def parse_updates_query(after: str | None, timeout: str | None) -> tuple[int, float]:
    """``?after=N&timeout=S`` of the updates route: (version seen, seconds to wait)."""
    seen = 0
    if after is not None:
        if _UINT.fullmatch(after) is None:
            raise BadRequest(f"'after' must be a version number (0, 1, 2, ...), got {after!r:.40}")
        seen = int(after)
    wait = DEFAULT_WAIT_S
    if timeout is not None:
        if _SECONDS.fullmatch(timeout) is None or float(timeout) > MAX_WAIT_S:
            raise BadRequest(
                f"'timeout' must be seconds from 0 to {MAX_WAIT_S:g}, got {timeout!r:.40}"
            )
        wait = float(timeout)
    return seen, wait


def parse_start_request(body: Any, limits: Limits) -> StartRequest:
    """Validate ``{"num_cpus": int, "nodes": int}`` (CPUs per node, node count)."""
    obj = _object(body, ("num_cpus", "nodes"), '{"num_cpus": 2, "nodes": 1}')
    return StartRequest(
        num_cpus=_int_in(obj, "num_cpus", 1, limits.max_cpus),
        nodes=_int_in(obj, "nodes", 1, limits.max_nodes),
    )


def parse_scale_request(body: Any, limits: Limits) -> ScaleRequest:
    """Validate ``{"nodes": int}``."""
    obj = _object(body, ("nodes",), '{"nodes": 2}')
    return ScaleRequest(nodes=_int_in(obj, "nodes", 1, limits.max_nodes))


def parse_address_request(body: Any) -> AddressRequest:
    """Validate ``{"address": "host:port"}``."""
    obj = _object(body, ("address",), '{"address": "127.0.0.1:6379"}')
    address = obj["address"]
    if not isinstance(address, str) or not valid_address(address):
        raise BadRequest(
            "'address' must be host:port of a cluster head (a host name or IP address and a "
            "port from 1 to 65535), e.g. 127.0.0.1:6379"
        )
    return AddressRequest(address=address)
