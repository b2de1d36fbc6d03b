"""The errors of compiled graphs (Ray's ``RayChannelError``, ``RayChannelTimeoutError`` and
``RayCgraphCapacityExceeded``, without the ``Ray`` prefix like the rest of
:mod:`nbcluster.exceptions`)."""

from __future__ import annotations

from nbcluster.exceptions import NbclusterError

__all__ = ["CgraphCapacityExceeded", "ChannelError", "ChannelTimeoutError"]


class ChannelError(NbclusterError):
    """A compiled graph's channel is closed or broken: the graph was torn down, or a
    process at the other end (an actor of the graph) is gone. Ray's ``RayChannelError``."""


class ChannelTimeoutError(ChannelError, TimeoutError):
    """Reading a compiled graph's result took longer than the timeout; the execution keeps
    running, and its result can be read later. Ray's ``RayChannelTimeoutError``."""


class CgraphCapacityExceeded(NbclusterError):
    """Too many executions of a compiled graph are in flight (submitted, results not yet
    read), or too many results are buffered. Ray's ``RayCgraphCapacityExceeded``."""
