"""What runs in a pool's processes: the actor that runs batches of calls, and how a
call's exception travels back (with its traceback, as ``multiprocessing`` does)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from multiprocessing.pool import RemoteTraceback
from typing import Any

import cloudpickle

__all__ = ["Failure", "PoolActor", "Call"]

#: One call of a batch: ``(args, kwargs)``.
Call = tuple[tuple[Any, ...], dict[str, Any]]


class Failure:
    """A call that raised: the exception and its formatted remote traceback.

    :meth:`exception` gives the exception with a ``RemoteTraceback`` as its ``__cause__``,
    so the traceback printed in the driver shows where it happened in the pool process.
    """

    __slots__ = ("error", "tb")

    def __init__(self, error: BaseException, tb: str) -> None:
        self.error = error
        self.tb = tb

    @classmethod
    def capture(cls, error: Exception) -> Failure:
        """Wrap ``error`` (being handled now); an exception that cannot be pickled is
        replaced by a ``RuntimeError`` carrying its type and text."""
        tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        try:
            cloudpickle.dumps(error)
        except Exception:  # noqa: BLE001 - anything that stops the exception travelling
            error = RuntimeError(
                f"{type(error).__name__}: {error} (the exception could not be pickled "
                "to send it back from the pool process)"
            )
        return cls(error, f'\n"""\n{tb}"""')

    def exception(self) -> BaseException:
        """The call's exception, ready to raise in the caller."""
        self.error.__cause__ = RemoteTraceback(self.tb)
        return self.error


class PoolActor:
    """One process of a :class:`~nbcluster.util.multiprocessing.Pool`.

    ``__init__`` runs the pool's ``initializer``; :meth:`run_batch` runs a chunk of calls
    and returns one result (or :class:`Failure`) per call, so one failing call does not
    lose the results of the others.
    """

    def __init__(
        self, initializer: Callable[..., Any] | None, initargs: Iterable[Any] | None
    ) -> None:
        if initializer is not None:
            initializer(*(initargs or ()))

    def ping(self) -> None:
        """Returns once the actor (and its initializer) is ready."""

    def run_batch(self, func: Callable[..., Any], batch: list[Call]) -> list[Any]:
        """``[func(*args, **kwargs) for args, kwargs in batch]``, with failures as values."""
        results: list[Any] = []
        for args, kwargs in batch:
            try:
                results.append(func(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - returned to the caller, as multiprocessing does
                results.append(Failure.capture(e))
        return results
