"""Every tunable of nbcluster, in one frozen dataclass (:class:`Config`).

The class lives in the runtime (``nbcluster._runtime.config``), which reads it in every
process and may not import the package above it; this module is its public name.
"""

from nbcluster._runtime.config import ENV_PREFIX, Config

__all__ = ["ENV_PREFIX", "Config"]
