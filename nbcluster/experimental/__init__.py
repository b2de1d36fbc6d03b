"""Experimental APIs (Ray's ``ray.experimental``): :mod:`.internal_kv`."""

from nbcluster.experimental import internal_kv

__all__ = ["internal_kv"]
