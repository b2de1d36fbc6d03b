"""A notebook carries its cluster: the shape ``%cluster start`` used, in the notebook's metadata.

``%cluster start`` records a :class:`ClusterSpec` (CPUs and GPUs per node, nodes, object
store size, autoscaling bounds, runtime environment, and the Python and nbcluster versions
it was recorded with) under the notebook metadata key ``"nbcluster"``. The kernel cannot
write the notebook file, so it publishes the record as a ``display_data`` output of type
:data:`METADATA_MIME`; the JupyterLab extension sees that message and writes it into the
open notebook's metadata, which is saved with the notebook.

``%cluster start`` with no arguments looks for a record and, when it finds one, starts
that cluster and says where the record came from. It looks, in order, at

1. what the JupyterLab extension sent when the kernel started (the open notebook's
   metadata, saved or not; environment variable :data:`ENV_VAR`, base64 JSON);
2. the notebook file this kernel runs for: ``__session__`` (set by ipykernel from
   ``JPY_SESSION_NAME``, which jupyter_server gives every kernel of a notebook; nbclient
   users pass it in ``env``) or VS Code's ``__vsc_ipynb_file__``.

A record is input from elsewhere (a colleague, Binder, CI): :func:`spec_from_metadata`
checks every field and refuses a bad one with a message saying what to do.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

from nbcluster.state import VERSION as __version__

__all__ = [
    "ENV_VAR",
    "METADATA_KEY",
    "METADATA_MIME",
    "ClusterSpec",
    "NotebookMetadataError",
    "find_saved_metadata",
    "publish",
    "spec_from_metadata",
]

#: The notebook metadata key (``nb.metadata["nbcluster"]``).
METADATA_KEY = "nbcluster"
#: The MIME type of the display message that asks the front end to record the spec.
METADATA_MIME = "application/vnd.nbcluster.notebook-metadata+json"
#: Where the JupyterLab extension puts the open notebook's record for the kernel.
ENV_VAR = "NBCLUSTER_NOTEBOOK_METADATA"
#: The version of the record's layout.
SCHEMA_VERSION = 1
#: A notebook file larger than this is not read for its metadata.
MAX_NOTEBOOK_BYTES = 64 << 20
_FIELDS = ("num_cpus", "num_gpus", "nodes", "object_store_memory", "max_nodes", "idle_timeout")


class NotebookMetadataError(ValueError):
    """The notebook's ``nbcluster`` metadata cannot be used; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The cluster a notebook asks for (what ``%cluster start`` arguments say)."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    nodes: int = 1
    object_store_memory: int | None = None
    max_nodes: int | None = None
    idle_timeout: float | None = None
    runtime_env: dict[str, Any] | None = None

    def arguments(self) -> str:
        """The ``%cluster start`` arguments that ask for this cluster."""
        parts = []
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None and not (name == "nodes" and value == 1):
                parts.append(f"--{name.replace('_', '-')} {_number(value)}")
        if self.runtime_env:
            parts.append(f"--runtime-env '{json.dumps(self.runtime_env, sort_keys=True)}'")
        return " ".join(parts) or "(no arguments)"

    def to_metadata(self) -> dict[str, Any]:
        """The notebook metadata value (``nb.metadata["nbcluster"]``)."""
        cluster = {n: getattr(self, n) for n in _FIELDS if getattr(self, n) is not None}
        record: dict[str, Any] = {"version": SCHEMA_VERSION, "cluster": cluster}
        if self.runtime_env:
            record["runtime_env"] = self.runtime_env
        record["recorded_with"] = recorded_with()
        return record


def recorded_with() -> dict[str, str]:
    """The versions a record is made with (compared when it is used elsewhere)."""
    return {"python": platform.python_version(), "nbcluster": __version__}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _amount(cluster: dict[str, Any], name: str, *, whole: bool, low: float) -> Any:
    value = cluster.get(name)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and whole:
        ok = float(value).is_integer()
    if not ok or not math.isfinite(value) or value < low:
        kind = "a whole number" if whole else "a number"
        raise NotebookMetadataError(f"cluster.{name} must be {kind} >= {low:g}, got {value!r:.60}")
    return int(value) if whole else value


def spec_from_metadata(record: Any) -> ClusterSpec:
    """The :class:`ClusterSpec` a notebook's ``nbcluster`` metadata records (checked)."""
    if not isinstance(record, dict):
        raise NotebookMetadataError(f"it must be an object, got {type(record).__name__}")
    version = record.get("version")
    if version != SCHEMA_VERSION:
        raise NotebookMetadataError(
            f"version {version!r:.20} is not one this nbcluster reads ({SCHEMA_VERSION}); "
            "it was recorded by another nbcluster"
        )
    cluster = record.get("cluster", {})
    if not isinstance(cluster, dict):
        raise NotebookMetadataError("cluster must be an object of %cluster start arguments")
    unknown = sorted(str(k) for k in cluster if k not in _FIELDS)
    if unknown:
        raise NotebookMetadataError(
            f"cluster has unknown fields {unknown[:5]}; known: {', '.join(_FIELDS)}"
        )
    runtime_env = record.get("runtime_env")
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise NotebookMetadataError("runtime_env must be an object (a Ray runtime_env)")
    spec = ClusterSpec(
        num_cpus=_amount(cluster, "num_cpus", whole=False, low=0),
        num_gpus=_amount(cluster, "num_gpus", whole=False, low=0),
        nodes=_amount(cluster, "nodes", whole=True, low=1) or 1,
        object_store_memory=_amount(cluster, "object_store_memory", whole=True, low=1),
        max_nodes=_amount(cluster, "max_nodes", whole=True, low=1),
        idle_timeout=_amount(cluster, "idle_timeout", whole=False, low=0),
        runtime_env=runtime_env or None,
    )
    if spec.max_nodes is not None and spec.max_nodes < spec.nodes:
        raise NotebookMetadataError(
            f"cluster.max_nodes ({spec.max_nodes}) is less than cluster.nodes ({spec.nodes})"
        )
    return spec


def _notebook_path(user_ns: dict[str, Any]) -> Path | None:
    for name in ("__session__", "__vsc_ipynb_file__"):
        value = user_ns.get(name)
        if isinstance(value, str) and value.endswith(".ipynb"):
            return Path(value)
    value = os.environ.get("JPY_SESSION_NAME", "")
    return Path(value) if value.endswith(".ipynb") else None


def find_saved_metadata(user_ns: dict[str, Any]) -> tuple[Any, str] | None:
    """``(record, where it came from)`` of this kernel's notebook, or None when it has none.

    Raises :class:`NotebookMetadataError` when a record is there but unreadable.
    """
    raw = os.environ.get(ENV_VAR, "")
    if raw:
        try:
            payload = json.loads(base64.b64decode(raw, validate=True).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise NotebookMetadataError(
                f"${ENV_VAR} is not base64 JSON (the JupyterLab extension sets it)"
            ) from None
        if payload is not None:
            return payload, "the notebook's metadata"
    path = _notebook_path(user_ns)
    if path is None or not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            return None
        nb = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # not a notebook we can read: nothing recorded
    metadata = nb.get("metadata") if isinstance(nb, dict) else None
    if not isinstance(metadata, dict) or METADATA_KEY not in metadata:
        return None
    return metadata[METADATA_KEY], f"the metadata of {path.name}"


def publish(spec: ClusterSpec) -> dict[str, Any]:
    """Ask the front end to record ``spec`` in the notebook's metadata; return the record.

    A ``display_data`` with only :data:`METADATA_MIME`: JupyterLab with the nbcluster
    extension writes it into the notebook; other front ends show nothing.
    """
    from IPython.display import publish_display_data

    record = spec.to_metadata()
    publish_display_data({METADATA_MIME: record}, metadata={METADATA_MIME: {"key": METADATA_KEY}})
    return record
