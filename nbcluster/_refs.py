"""``ObjectRef`` for the API layer (defined in :mod:`nbcluster._runtime.refs`).

The runtime makes and counts refs, so the class lives there; the API modules, the libraries
and users import it from here or from ``nbcluster``.
"""

from nbcluster._runtime.refs import ObjectRef

__all__ = ["ObjectRef"]
