"""The router: sends a deployment's requests to its replicas, for handles and proxies alike.

One :class:`Router` per (process, deployment). It learns the deployment's running
replicas (and ``max_ongoing_requests``, ``max_queued_requests``, the models each replica
holds) by long-polling the controller on a thread of its own, so the controller is never
on a request's path and a change reaches every router within milliseconds of the
controller deciding it.

A request is sent at once to the replica :func:`~nbcluster.serve._routing.choose_replica`
picks (power of two choices on this router's count of unanswered requests per replica);
when every replica is full, or none runs yet, it waits in the router's queue (bounded by
``max_queued_requests``: beyond it, :class:`BackPressureError`). Answers are noticed by
the process's :mod:`watcher <nbcluster.serve._watch>`, which frees the slot, sends the
next queued request, and completes the caller's future. A replica that answers
:data:`~nbcluster.serve._replica.REJECTED` is draining: the request goes to another
replica. A replica that died fails the requests it had (the controller is told at once
and replaces it); requests queued here are unaffected.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import os
import threading
import time
from typing import Any

import nbcluster
from nbcluster.exceptions import ActorError
from nbcluster.serve._client import session_key
from nbcluster.serve._replica import Rejected
from nbcluster.serve._routing import ReplicaSlot, choose_replica
from nbcluster.serve._watch import value_future, watcher
from nbcluster.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    RequestCancelledError,
)

__all__ = ["Request", "Router", "new_request_id"]

_ids = itertools.count()
_MAX_REROUTES = 100


def new_request_id() -> str:
    """A process-unique request id."""
    return f"{os.getpid():x}-{next(_ids):x}"


class Request:
    """One request through a router: what to call, and the future of its value."""

    __slots__ = (
        "kind",
        "method",
        "args",
        "kwargs",
        "model_id",
        "request_id",
        "result",
        "ref",
        "sent",
        "reroutes",
        "cancelled",
        "__weakref__",
    )

    def __init__(
        self,
        kind: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        model_id: str = "",
        request_id: str = "",
    ) -> None:
        self.kind = kind  # "call" or "http"
        self.method = method  # a method name, or the route for "http"
        self.args = args
        self.kwargs = kwargs
        self.model_id = model_id
        self.request_id = request_id or new_request_id()
        self.result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.ref: Any = None  # the ref of the answer that completed it
        self.sent: Any = None  # the ref of the latest attempt
        self.reroutes = 0
        self.cancelled = False


class Router:
    """The requests of one deployment in this process (see the module docstring)."""

    def __init__(self, app: str, deployment: str, controller: Any) -> None:
        self.app = app
        self.deployment = deployment
        self._controller = controller
        self._lock = threading.Lock()
        self._slots: dict[str, ReplicaSlot] = {}
        self._handles: dict[str, Any] = {}
        self._refused: set[str] = set()
        self._max_ongoing = 5
        self._max_queued = -1
        self._queue: collections.deque[Request] = collections.deque()
        self._unavailable: str = ""
        self._known: Any = None
        self._closed = False
        self._session = session_key()
        self.updated = threading.Event()
        self._thread = threading.Thread(
            target=self._listen, name=f"serve-router-{app}-{deployment}", daemon=True
        )
        self._thread.start()

    # -- requests ----------------------------------------------------------------------------
    def submit(self, req: Request) -> Request:
        """Send ``req`` (or queue it); its ``result`` future completes with the answer."""
        pending = [a for a in (*req.args, *req.kwargs.values()) if _is_response(a)]
        if not pending:
            self._dispatch(req)
            return req
        # Responses passed as arguments: wait (here, not in the caller) for them to finish,
        # then pass their refs, so the replica reads the values straight from where they are.
        left = [len(pending)]
        lock = threading.Lock()

        def one_done(_: Any) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            for p in pending:
                err = p._request.result.exception()
                if err is not None:
                    _fail(req, err)
                    return
            req.args = tuple(_ref_of(a) for a in req.args)
            req.kwargs = {k: _ref_of(v) for k, v in req.kwargs.items()}
            self._dispatch(req)

        for p in pending:
            p._request.result.add_done_callback(one_done)
        return req

    def _dispatch(self, req: Request) -> None:
        if req.cancelled:
            _fail(req, RequestCancelledError(req.request_id))
            return
        with self._lock:
            slot = self._choose(req)
            if slot is None:
                if self._unavailable:
                    err: BaseException | None = DeploymentUnavailableError(
                        self.deployment, self.app, self._unavailable
                    )
                elif 0 < self._max_queued <= len(self._queue):
                    err = BackPressureError(
                        num_queued_requests=len(self._queue), max_queued_requests=self._max_queued
                    )
                else:
                    err = None
                    self._queue.append(req)
                if err is None:
                    return
            else:
                slot.inflight += 1
                handle = self._handles[slot.replica_id]
        if slot is None:
            _fail(req, err)  # type: ignore[arg-type]
            return
        self._send(req, slot, handle)

    def _choose(self, req: Request) -> ReplicaSlot | None:
        slots = self._slots
        if self._refused:
            candidates = [s for s in slots.values() if s.replica_id not in self._refused]
        else:
            candidates = list(slots.values())
        return choose_replica(candidates, self._max_ongoing, model_id=req.model_id)

    def _send(self, req: Request, slot: ReplicaSlot, handle: Any) -> None:
        meta = (req.method, req.model_id, req.request_id)
        try:
            if req.kind == "http":
                ref = handle.handle_http.remote(meta, *req.args)
            else:
                ref = handle.handle_request.remote(meta, *req.args, **req.kwargs)
        except BaseException as e:  # noqa: BLE001 - e.g. an unpicklable argument
            with self._lock:
                slot.inflight -= 1
            _fail(req, e)
            self._pump()
            return
        req.sent = ref
        watcher().watch(ref, lambda r: self._done(req, slot, r))

    def _done(self, req: Request, slot: ReplicaSlot, ref: Any) -> None:
        """On the watcher thread: an answer (or an error) for ``req`` from ``slot``."""
        with self._lock:
            slot.inflight -= 1
        try:
            value = nbcluster.get(ref)
        except ActorError as e:
            self._replica_failed(slot.replica_id)
            _fail(req, e)
        except BaseException as e:  # noqa: BLE001 - the caller gets the replica's error
            req.ref = ref
            _fail(req, e)
        else:
            if type(value) is Rejected:
                with self._lock:
                    self._refused.add(slot.replica_id)
                req.reroutes += 1
                if req.reroutes > _MAX_REROUTES:
                    _fail(
                        req,
                        DeploymentUnavailableError(
                            self.deployment, self.app, "every replica is draining"
                        ),
                    )
                else:
                    self._dispatch(req)
            else:
                req.ref = ref
                if not req.result.done():
                    req.result.set_result(value)
        self._pump()

    def _pump(self) -> None:
        """Send queued requests while replicas have room."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                slot = self._choose(self._queue[0])
                if slot is None:
                    return
                req = self._queue.popleft()
                slot.inflight += 1
                handle = self._handles[slot.replica_id]
            if req.cancelled:
                with self._lock:
                    slot.inflight -= 1
                _fail(req, RequestCancelledError(req.request_id))
                continue
            self._send(req, slot, handle)

    def cancel(self, req: Request) -> None:
        """Cancel ``req`` if it has not been sent yet (a sent request runs to the end)."""
        req.cancelled = True
        with self._lock:
            try:
                self._queue.remove(req)
            except ValueError:
                return
        _fail(req, RequestCancelledError(req.request_id))

    def _replica_failed(self, replica_id: str) -> None:
        with self._lock:
            if self._slots.pop(replica_id, None) is None:
                return
            self._handles.pop(replica_id, None)
        # Tell the controller now rather than at its next health check (it also notices alone).
        with contextlib.suppress(Exception):
            self._controller.report_replica_failure.remote(self.app, self.deployment, replica_id)

    def queued(self) -> int:
        """Requests waiting here for a free replica."""
        return len(self._queue)

    # -- updates from the controller ----------------------------------------------------------
    def _listen(self) -> None:
        key = f"replicas:{self.app}#{self.deployment}"
        failures = 0
        while not self._closed:
            try:
                ref = self._controller.listen_for_change.remote({key: self._known})
                # The first answer comes at once; later ones only when something changes.
                updates = value_future(ref).result()
            except Exception:  # noqa: BLE001 - the controller is restarting or gone
                failures += 1
                if self._closed or not self._same_session():
                    return
                time.sleep(min(0.05 * failures, 1.0))
                continue
            failures = 0
            if key in updates:
                version, snapshot = updates[key]
                self._known = version
                self._apply(snapshot)

    def _apply(self, snapshot: dict[str, Any] | None) -> None:
        with self._lock:
            if snapshot is None:
                self._unavailable = "the deployment does not exist (deleted, or never deployed)"
                self._slots.clear()
                self._handles.clear()
                failed = list(self._queue)
                self._queue.clear()
            else:
                self._unavailable = snapshot.get("unavailable", "")
                self._max_ongoing = int(snapshot["max_ongoing_requests"])
                self._max_queued = int(snapshot["max_queued_requests"])
                models = snapshot.get("models", {})
                slots: dict[str, ReplicaSlot] = {}
                handles: dict[str, Any] = {}
                for rid, handle in snapshot["replicas"]:
                    slot = self._slots.get(rid) or ReplicaSlot(rid)
                    slot.models = frozenset(models.get(rid, ()))
                    slots[rid] = slot
                    handles[rid] = self._handles.get(rid) or handle
                self._slots, self._handles = slots, handles
                self._refused &= set(slots)
                failed = list(self._queue) if self._unavailable and not slots else []
                if failed:
                    self._queue.clear()
        for req in failed:
            _fail(req, DeploymentUnavailableError(self.deployment, self.app, self._unavailable))
        self.updated.set()
        self._pump()

    def _same_session(self) -> bool:
        """False once this process left the cluster the router was made for."""
        try:
            return nbcluster.is_initialized() and session_key() == self._session
        except Exception:  # noqa: BLE001 - disconnected
            return False

    def close(self) -> None:
        """Stop listening (the requests already sent still complete)."""
        self._closed = True


def _fail(req: Request, err: BaseException) -> None:
    if not req.result.done():
        req.result.set_exception(err)


def _is_response(value: Any) -> bool:
    return getattr(type(value), "_is_deployment_response", False) is True


def _ref_of(value: Any) -> Any:
    return value._request.ref if _is_response(value) else value
