"""The public error tree.

The names mirror Ray's ``ray.exceptions`` (2.60) one for one, so that code which catches
Ray's errors reads the same here: ``RayTaskError`` is :class:`TaskError`, ``RayActorError``
is :class:`ActorError`, ``RaySystemError`` is :class:`NbclusterSystemError`, and
``LocalRayletDiedError`` is :class:`LocalNodeDiedError`. Two types are new:
:class:`HeadUnavailableError` (Ray kills the process instead) and :class:`SerializationError`
(Ray raises a plain ``TypeError``).

Every message says what happened, where, and what to do next. Every exception survives a
(cloud)pickle round trip with its attributes: :meth:`NbclusterError.__reduce__` rebuilds the
object without calling ``__init__``, so constructor signatures are free to differ from
``args``.

The classes are defined by area under :mod:`nbcluster._runtime.exceptions` (the runtime
raises them and imports nothing above itself); this module is where users import them from,
and the name each class gives as its ``__module__``. Its ``__all__`` is the runtime's
(every error type there, so a new one is listed in one place), without the runtime's
constant ``MAX_TRACEBACK_BYTES`` (importable from here, not exported).
"""

from nbcluster._runtime import exceptions as _runtime
from nbcluster._runtime.exceptions import *  # noqa: F403 - exactly the runtime's __all__

# The forms type checkers read statically (``+=`` another module's ``__all__``, ``remove``).
__all__: list[str] = []
__all__ += _runtime.__all__
__all__.remove("MAX_TRACEBACK_BYTES")
