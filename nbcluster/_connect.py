"""How the job client, the state API, ``internal_kv`` and the CLI reach a cluster's head.

``address`` may be ``"host:port"`` (the head's port), ``"nbcluster://host:port"``, or
``"auto"`` (the newest cluster started on this host). ``None`` means: the cluster this
process is connected to (``nbcluster.init()``), else ``NBCLUSTER_ADDRESS``, else ``"auto"``.
The token comes from ``NBCLUSTER_TOKEN``, ``NBCLUSTER_TOKEN_FILE``, or the token file of a
cluster on this host; every call carries it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from nbcluster import exceptions as exc
from nbcluster._runtime import context, proc
from nbcluster._runtime.jobs.head_client import HeadJobsClient, jpb
from nbcluster._runtime.runtime_env import resolve as env_resolve
from nbcluster._runtime.runtime_env import spec as env_spec
from nbcluster._runtime.runtime_env.settings import RuntimeEnvSettings
from nbcluster.cluster import find_session
from nbcluster.config import Config

__all__ = ["HeadClient", "connect", "connected", "job_request", "resolve", "uploader"]

#: The blocking client of a head that :func:`connect` returns.
HeadClient = HeadJobsClient


def connected() -> bool:
    """True when this process is connected to a cluster (``nbcluster.init()``)."""
    return context.current_client() is not None


def resolve(address: str | None) -> tuple[str, str]:
    """(head address, token) for ``address`` (see the module docstring)."""
    if address is None:
        client = context.current_client()
        if (
            client is not None
            and getattr(client, "head_address", "")
            and getattr(client, "token", "")
        ):
            return client.head_address, client.token  # type: ignore[return-value]
        address = os.environ.get("NBCLUSTER_ADDRESS") or "auto"
    if not isinstance(address, str) or not address:
        raise TypeError(
            f"address must be 'host:port', 'nbcluster://host:port' or 'auto', got {address!r}"
        )
    for scheme in ("nbcluster://", "http://", "https://"):
        if address.startswith(scheme):
            address = address[len(scheme) :].rstrip("/")
    config = Config.from_env()
    session = find_session(address, config.temp_dir)
    if address == "auto":
        if session is None:
            raise ConnectionError(
                "no running cluster was found on this host; start one (`nbcluster start --head`, "
                "nbcluster.init() or %cluster start) or pass its address"
            )
        address = (session / proc.HEAD_ADDRESS_FILE).read_text().strip()
    token = os.environ.get("NBCLUSTER_TOKEN", "")
    if not token and os.environ.get("NBCLUSTER_TOKEN_FILE"):
        token = proc.read_token(os.environ["NBCLUSTER_TOKEN_FILE"])
    if not token and session is not None:
        token = proc.read_token(session / proc.TOKEN_FILE)
    if not token:
        raise exc.AuthenticationError(
            f"no token for the cluster at {address}: set NBCLUSTER_TOKEN, or NBCLUSTER_TOKEN_FILE "
            "to the token file `nbcluster start` printed"
        )
    return address, token


def connect(address: str | None, timeout: float = 30.0, token: str | None = None) -> HeadJobsClient:
    """A blocking client of the head at ``address`` (``token`` overrides the lookup)."""
    if token:
        if not address:
            raise ValueError("an explicit token needs an explicit address")
        return HeadJobsClient(resolve_address_only(address), token, timeout=timeout)
    head, found = resolve(address)
    return HeadJobsClient(head, found, timeout=timeout)


def resolve_address_only(address: str) -> str:
    """``address`` without its scheme."""
    for scheme in ("nbcluster://", "http://", "https://"):
        if address.startswith(scheme):
            address = address[len(scheme) :].rstrip("/")
    return address


def uploader(head: HeadJobsClient) -> env_resolve.Uploader:
    """Packs and uploads local runtime_env directories to this head (once per content)."""
    settings = RuntimeEnvSettings.from_env(Config.from_env().temp_dir)
    return env_resolve.Uploader(
        head.package_exists, head.upload_package, settings.max_package_bytes
    )


def job_request(
    up: env_resolve.Uploader,
    *,
    entrypoint: str,
    runtime_env: Mapping[str, Any] | None,
    submission_id: str,
    metadata: Mapping[str, str],
    num_cpus: float,
    num_gpus: float,
    resources: Mapping[str, float],
) -> jpb.SubmitJobRequest:
    """A job submission, its ``runtime_env`` checked and its local paths uploaded."""
    env = env_spec.validate(runtime_env)
    resolved = env_resolve.resolve(env, up)
    return jpb.SubmitJobRequest(
        entrypoint=entrypoint,
        submission_id=submission_id,
        runtime_env=env_spec.to_json(resolved),
        metadata=dict(metadata),
        entrypoint_num_cpus=num_cpus,
        entrypoint_num_gpus=num_gpus,
        entrypoint_resources=dict(resources),
    )
