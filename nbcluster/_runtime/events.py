"""The subscriber side of the head's event stream (``events.proto``), on a thread.

:class:`EventStream` keeps one ``Events/Subscribe`` call open to a head from a daemon
thread and hands every batch it receives to a callback. When the stream breaks (the head
restarted, the network dropped) it tells the callback once (``on_disconnect``) and
subscribes again with a fresh snapshot, backing off up to a few seconds between tries.
Errors that retrying cannot fix (a wrong token, a bad request) end the stream.

It uses a blocking channel, so it works from any thread and beside any event loop (the
kernel's, jupyter_server's). Nothing here unpickles anything: events are protobuf.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from nbcluster._runtime.protocol.errors import RpcCancelled, RpcFailure
from nbcluster._runtime.protocol.protos import events_pb2 as epb
from nbcluster._runtime.protocol.protos import events_pb2_grpc as epb_grpc
from nbcluster._runtime.protocol.rpc import SyncStub, make_sync_channel

__all__ = ["EventStream", "epb"]

log = logging.getLogger(__name__)

#: Status codes that retrying cannot fix: the stream ends and ``on_error`` is called.
_FATAL = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
)
_BACKOFF_START_S = 0.2
_BACKOFF_MAX_S = 5.0


class EventStream:
    """One subscription to a head, delivered on the thread ``nbcluster-events``.

    ``on_batch(batch)`` gets each ``EventBatch`` (the snapshot first when ``snapshot``);
    ``on_disconnect(reason)`` is called when an open stream broke (a new snapshot
    follows once the head answers again); ``on_error(message)`` when the stream ended
    for good. Callbacks run on the stream's thread and must be quick.
    """

    def __init__(
        self,
        address: str,
        token: str,
        on_batch: Callable[[Any], None],
        *,
        kinds: Sequence[str] = (),
        snapshot: bool = True,
        buffer: int = 0,
        job_id: bytes = b"",
        on_disconnect: Callable[[str], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        name: str = "nbcluster-events",
    ) -> None:
        self.address = address
        self._token = token
        self._request = epb.SubscribeRequest(
            kinds=list(kinds), snapshot=snapshot, buffer=buffer, job_id=job_id
        )
        self._on_batch = on_batch
        self._on_disconnect = on_disconnect
        self._on_error = on_error
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._call: Any = None
        self._channel: grpc.Channel | None = None
        #: Set once the first batch of the current subscription arrived.
        self.ready = threading.Event()
        #: The final error, when the stream ended for good.
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """True while the thread runs (subscribed, or retrying)."""
        return self._thread.is_alive()

    def wait_ready(self, timeout: float) -> bool:
        """Wait for the first batch (the snapshot); False at the deadline or after an error."""
        return self.ready.wait(timeout) and self.error is None

    def close(self, timeout: float = 5.0) -> None:
        """Cancel the call and stop the thread (idempotent)."""
        self._closed.set()
        with self._lock:
            call, channel = self._call, self._channel
        if call is not None:
            call.cancel()
        if channel is not None:
            channel.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = _BACKOFF_START_S
        while not self._closed.is_set():
            channel = make_sync_channel(self.address, self._token)
            with self._lock:
                if self._closed.is_set():
                    channel.close()
                    return
                self._channel = channel
            got_any = False
            try:
                stub = SyncStub(epb_grpc.EventsStub(channel), self._token, self.address)
                call = stub.Subscribe(self._request)
                with self._lock:
                    self._call = call
                if self._closed.is_set():
                    call.cancel()
                for batch in call:
                    got_any = True
                    backoff = _BACKOFF_START_S
                    self.ready.set()
                    self._deliver(self._on_batch, batch)
                reason = "the head ended the stream"
            except RpcFailure as err:
                code = err.code()
                if self._closed.is_set() or isinstance(err, RpcCancelled):
                    return
                if code in _FATAL:
                    self.error = f"{code.name}: {err.details()}"
                    self.ready.set()
                    if self._on_error is not None:
                        self._deliver(self._on_error, self.error)
                    return
                reason = f"{code.name}: {err.details()}"
            finally:
                with self._lock:
                    self._call = None
                    self._channel = None
                channel.close()
            if self._closed.is_set():
                return
            if got_any:
                self.ready.clear()
                if self._on_disconnect is not None:
                    self._deliver(self._on_disconnect, reason)
            log.debug("event stream to %s broke (%s); retrying", self.address, reason)
            if self._closed.wait(backoff):
                return
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _deliver(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except Exception:  # noqa: BLE001 - a broken subscriber must not end the stream
            log.exception("an event stream callback failed")
