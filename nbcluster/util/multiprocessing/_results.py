"""The results of a :class:`~nbcluster.util.multiprocessing.Pool`: ``AsyncResult`` (from
``apply_async``/``map_async``/``starmap_async``) and the iterators of ``imap`` and
``imap_unordered``.

A submitted chunk of calls is one actor call whose value is a list with one entry per
call: the call's result, or a :class:`~._worker.Failure` that is raised in its place.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from multiprocessing import TimeoutError as MpTimeoutError
from typing import Any

import nbcluster

from ._worker import Call, Failure

__all__ = ["AsyncResult", "IMapIterator"]

_UNSET = object()


class AsyncResult:
    """The result of ``apply_async``, ``map_async`` or ``starmap_async``.

    ``get(timeout)`` returns the value (a list for the map variants) or raises the first
    failing call's exception; it raises ``multiprocessing.TimeoutError`` when the timeout
    expires first. ``callback`` (with the value) or ``error_callback`` (with the first
    exception) is called once, from a helper thread, as soon as the result is ready.
    """

    def __init__(
        self,
        chunk_refs: list[nbcluster.ObjectRef],
        *,
        single: bool,
        callback: Callable[[Any], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> None:
        self._refs = chunk_refs
        self._single = single
        self._lock = threading.Lock()
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._settled = False
        if callback is not None or error_callback is not None:
            threading.Thread(
                target=self._notify,
                args=(callback, error_callback),
                name="nbcluster-pool-callback",
                daemon=True,
            ).start()

    def _settle(self, timeout: float | None) -> bool:
        """Collect the result if every chunk is done within ``timeout``; True when settled."""
        if self._settled:
            return True
        refs = self._refs
        if refs:
            ready, _ = nbcluster.wait(refs, num_returns=len(refs), timeout=timeout)
            if len(ready) < len(refs):
                return False
        with self._lock:
            if self._settled:
                return True
            values: list[Any] = []
            error: BaseException | None = None
            for ref in refs:
                try:
                    chunk = nbcluster.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost process, kept as the result
                    error = e
                    break
                for item in chunk:
                    if isinstance(item, Failure):
                        error = item.exception()
                        break
                    values.append(item)
                if error is not None:
                    break
            if error is not None:
                self._error = error
            else:
                self._value = values[0] if self._single else values
            self._refs = []  # the values are kept here now; let the store free them
            self._settled = True
        return True

    def _notify(
        self,
        callback: Callable[[Any], object] | None,
        error_callback: Callable[[BaseException], object] | None,
    ) -> None:
        self._settle(None)
        if self._error is None:
            if callback is not None:
                callback(self._value)
        elif error_callback is not None:
            error_callback(self._error)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is ready or ``timeout`` seconds pass (never raises)."""
        self._settle(timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The result; re-raises the call's exception; ``multiprocessing.TimeoutError``
        if it is not ready within ``timeout`` seconds."""
        if not self._settle(timeout):
            raise MpTimeoutError
        if self._error is not None:
            raise self._error
        return self._value

    def ready(self) -> bool:
        """Whether the calls have finished (successfully or not)."""
        return self._settle(0)

    def successful(self) -> bool:
        """Whether every call finished without an exception; ``ValueError`` if not ready."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._error is None


class IMapIterator:
    """The iterator of ``imap`` (results in order) and ``imap_unordered`` (as they finish).

    The input is read lazily: a few chunks per pool process are in flight at a time and
    more are submitted as results are taken, so a long or endless iterable is fine. A
    failing call raises its exception from the ``next()`` that reaches it; iteration can
    go on after it. ``next(timeout)`` raises ``multiprocessing.TimeoutError``.
    """

    def __init__(
        self,
        submit: Callable[[Callable[..., Any], list[Call]], nbcluster.ObjectRef],
        func: Callable[..., Any],
        chunks: Iterator[list[Call]],
        *,
        ordered: bool,
        window: int,
    ) -> None:
        self._submit = submit
        self._func = func
        self._chunks = chunks
        self._ordered = ordered
        self._window = window
        self._inflight: collections.deque[nbcluster.ObjectRef] = collections.deque()
        self._ready: collections.deque[Any] = collections.deque()
        self._exhausted = False
        self._lock = threading.Lock()
        self._fill()

    def _fill(self) -> None:
        while not self._exhausted and len(self._inflight) < self._window:
            chunk = next(self._chunks, None)
            if chunk is None:
                self._exhausted = True
                break
            self._inflight.append(self._submit(self._func, chunk))

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: float | None = None) -> Any:
        """The next result; ``multiprocessing.TimeoutError`` if none within ``timeout``."""
        with self._lock:
            while not self._ready:
                if not self._inflight:
                    raise StopIteration
                if self._ordered:
                    ref = self._inflight[0]
                    ready, _ = nbcluster.wait([ref], timeout=timeout)
                else:
                    ready, _ = nbcluster.wait(list(self._inflight), timeout=timeout)
                if not ready:
                    raise MpTimeoutError
                self._inflight.remove(ready[0])
                self._ready.extend(nbcluster.get(ready[0]))
                self._fill()
            item = self._ready.popleft()
        if isinstance(item, Failure):
            raise item.exception()
        return item
