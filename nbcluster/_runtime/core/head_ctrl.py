"""The driver's placement-group calls to the head over its control channel.

``protocol/ctrl.py`` carries a call as one frame each way on a blocking socket, made from
the calling thread (no hop to the I/O loop, no gRPC): a placement group's create or
remove costs a fraction of a gRPC unary call. The head's control address is asked once
over gRPC (``Control.ControlAddress``). Errors and retries are those of the gRPC path:

- an error reply is the :class:`RpcFailure` of its code, translated as ``call_head`` does;
- a broken connection (the head died or restarted) sends that call over gRPC instead,
  through ``CoreClient.call_head``, which retries for the grace period; the control
  address is asked again on the next call (a restarted head listens elsewhere). Every
  call here is idempotent at the head (a create is keyed by the group's id, a second
  remove of a group is a no-op), so a call that ran before the connection broke is safe
  to send again, as gRPC's retries already do;
- a head that answers nothing (stopped, hung) for the grace period fails the call with
  ``HeadUnavailableError``, as ``HeadRetry`` does: pings at half of it tell a slow call
  (a removal waiting for its nodes) from a silent head.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import grpc

from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.ctrl import CtrlBroken, CtrlClient, token_fits
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.protos import ctrl_pb2, ctrl_pb2_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub

__all__ = ["HeadControl", "head_control"]

_controls: weakref.WeakKeyDictionary[CoreClient, HeadControl] = weakref.WeakKeyDictionary()
_controls_lock = threading.Lock()


def head_control(client: CoreClient) -> HeadControl:
    """The client's :class:`HeadControl` (one per client, made on first use)."""
    control = _controls.get(client)
    if control is None:
        with _controls_lock:
            control = _controls.get(client)
            if control is None:
                control = _controls[client] = HeadControl(client)
    return control


class HeadControl:
    """Calls to the head over its control channel, falling back to gRPC."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client
        self.address: str | None = None  # None: not asked yet; "": the head serves none
        self.ctrl: CtrlClient | None = None
        self._lock = threading.Lock()

    def _ask_address(self) -> str | None:
        client = self.client
        timeout = max(1.0, min(5.0, client.config.head_grace_period_s / 2))

        def ask() -> Any:  # on the I/O loop, where the client's gRPC channels live
            address = client.head_address
            raw = ctrl_pb2_grpc.ControlStub(client.channels.channel(address))
            stub = AuthedStub(raw, client.token, address)
            return stub.ControlAddress(ctrl_pb2.ControlAddressRequest(), timeout=timeout)

        try:
            reply = client.run(ask)
        except RpcFailure as err:
            # An older head serves no control channel; otherwise ask again next time.
            return "" if err.code() == grpc.StatusCode.UNIMPLEMENTED else None
        return reply.address

    def _channel(self) -> CtrlClient | None:
        with self._lock:
            if self.ctrl is not None:
                return self.ctrl
            if self.address is None:
                on = self.client.config.control_channels and token_fits(self.client.token)
                self.address = self._ask_address() if on else ""
            if not self.address:
                return None
            client = self.client
            settings = tls.current()
            self.ctrl = CtrlClient(
                self.address,
                client.token,
                max_frame=client.config.rpc_max_message_bytes,
                silent_s=client.config.head_grace_period_s,
                ssl_context=tls.ssl_context(settings, server=False) if settings else None,
                server_hostname=settings.server_name if settings else None,
            )
            return self.ctrl

    def _broken(self, ctrl: CtrlClient) -> None:
        with self._lock:
            if self.ctrl is ctrl:
                self.ctrl = None
                self.address = None
        ctrl.close()

    def call(
        self,
        what: str,
        method: str,
        request: Any,
        reply_type: type,
        timeout: float,
        *,
        not_found: str | None = None,
    ) -> Any:
        """``method(request)`` at the head; its gRPC error raised as nbcluster's exception
        (``not_found``: the ``ValueError`` text for NOT_FOUND), as ``call_head`` does."""
        client = self.client
        ctrl = None if client.closed else self._channel()
        if ctrl is not None:
            try:
                return ctrl.call(method, request, reply_type, timeout)
            except CtrlBroken:
                self._broken(ctrl)  # this call goes over gRPC, with its retries
            except RpcFailure as err:
                raise to_exception(err, Peer.HEAD, what, not_found=not_found) from None
        return client.call_head(
            what,
            lambda head: getattr(head, method)(request, timeout=timeout),
            not_found=not_found,
        )
