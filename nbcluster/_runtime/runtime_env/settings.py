"""The runtime_env tunables, read from ``NBCLUSTER_RUNTIME_ENV_*`` variables when needed.

=========================================  ==============================================
``NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES``  largest working_dir / py_module (100 MiB)
``NBCLUSTER_RUNTIME_ENV_DIR``                per-host cache of packages and pip envs
                                             (default ``<temp_dir>/runtime_resources``)
``NBCLUSTER_RUNTIME_ENV_INSTALLER``          ``auto`` (uv when found, else pip), ``uv``, ``pip``
``NBCLUSTER_OVERRIDE_JOB_RUNTIME_ENV``       ``1``: ``init(runtime_env=)`` wins over the job's
=========================================  ==============================================
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from nbcluster._runtime.runtime_env.pack import DEFAULT_MAX_PACKAGE_BYTES

__all__ = ["RuntimeEnvSettings"]

_INSTALLERS = ("auto", "uv", "pip")


@dataclasses.dataclass(frozen=True)
class RuntimeEnvSettings:
    """Limits and locations of runtime environments."""

    max_package_bytes: int = DEFAULT_MAX_PACKAGE_BYTES
    cache_dir: str = ""
    installer: str = "auto"
    override_job_env: bool = False

    @classmethod
    def from_env(
        cls, temp_dir: str, environ: Mapping[str, str] | None = None
    ) -> RuntimeEnvSettings:
        """Read the variables (``temp_dir`` is the cluster's, for the default cache dir)."""
        env = os.environ if environ is None else environ
        raw = env.get("NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES", "")
        try:
            limit = int(raw) if raw.strip() else DEFAULT_MAX_PACKAGE_BYTES
        except ValueError:
            raise ValueError(
                f"NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES must be a number of bytes, got {raw!r}"
            ) from None
        if limit <= 0:
            raise ValueError(f"NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES must be > 0, got {limit}")
        installer = env.get("NBCLUSTER_RUNTIME_ENV_INSTALLER", "auto").strip().lower() or "auto"
        if installer not in _INSTALLERS:
            raise ValueError(
                f"NBCLUSTER_RUNTIME_ENV_INSTALLER must be one of {', '.join(_INSTALLERS)}, "
                f"got {installer!r}"
            )
        cache = env.get("NBCLUSTER_RUNTIME_ENV_DIR", "") or os.path.join(
            temp_dir, "runtime_resources"
        )
        override = env.get("NBCLUSTER_OVERRIDE_JOB_RUNTIME_ENV", "").strip().lower() in (
            "1",
            "true",
            "yes",
        )
        return cls(limit, cache, installer, override)
