"""Every tunable of nbcluster, in one frozen dataclass (public face).

:class:`Config` is defined in :mod:`nbcluster._runtime.config` (the runtime's processes
read it and import nothing above the runtime); this module is where users import it from.
Nothing is read at import: :meth:`Config.from_env` reads ``NBCLUSTER_<FIELD>`` variables.
"""

from nbcluster._runtime.config import ENV_PREFIX, Config

__all__ = ["ENV_PREFIX", "Config"]
