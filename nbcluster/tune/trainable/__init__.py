"""Trainables: the ``Trainable`` class API and the ``with_parameters``/``with_resources`` wrappers."""

from nbcluster.tune.trainable.trainable import Trainable
from nbcluster.tune.trainable.util import with_parameters, with_resources

__all__ = ["Trainable", "with_parameters", "with_resources"]
