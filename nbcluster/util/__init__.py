"""Utilities built on the public API: :class:`ActorPool`."""

from nbcluster.util.actor_pool import ActorPool

__all__ = ["ActorPool"]
