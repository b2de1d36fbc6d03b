"""The client-mode proxy: a driver on the head's host that runs API calls for remote clients.

A notebook that can reach only the head talks to ``ClientProxy/Call`` on the head's port;
the head relays the bytes to this process. Here payloads are unpickled (this is a driver:
it runs user code anyway), the named :class:`~nbcluster._runtime.driver.Driver` call is
made on this process's ``CoreDriver``, and the result is pickled back, with every ref in it
registered in the client's session. Objects and actors stay owned by this process, per
client session, until the client releases them or disconnects; so a client whose link
drops for a while finds its work intact when it comes back.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import grpc

from nbcluster._runtime import client_slot
from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.driver import CoreDriver
from nbcluster._runtime.driver import DRIVER_CALLS, ActorRecord
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster._runtime.refs import ObjectRef, _rebuild_ref

log = logging.getLogger(__name__)

CLIENT_OWNER = "client-proxy"
SESSION_IDLE_S = 600.0

_current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "nbc_proxy_session", default=None
)


class Session:
    """What one client holds: its refs, and the actors it created (owned here)."""

    def __init__(self, sid: bytes) -> None:
        self.sid = sid
        self.refs: dict[bytes, ObjectRef] = {}
        self.actors: set[bytes] = set()
        self.last_seen = time.monotonic()
        self.lock = threading.Lock()

    def register(self, ref: ObjectRef) -> bytes:
        with self.lock:
            self.refs[ref.binary()] = ref
        return ref.binary()

    def resolve(self, oid: bytes) -> ObjectRef:
        with self.lock:
            ref = self.refs.get(oid)
        if ref is None:
            raise exc.ObjectFreedError(oid.hex(), "the client released this ref")
        return ref


def resolve_client_ref(oid: bytes) -> ObjectRef | None:
    """Called when a client's ref is unpickled here: the real ref of the session."""
    session = _current_session.get()
    return None if session is None else session.resolve(oid)


client_slot.client_ref_resolver = resolve_client_ref


class _ToClientPickler(cloudpickle.CloudPickler):
    """Pickles results for the client: real refs become client-side stand-ins."""

    def __init__(self, file: io.BytesIO, session: Session) -> None:
        super().__init__(file, protocol=5)
        self.session = session

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, ObjectRef):
            return (_rebuild_ref, (self.session.register(obj), CLIENT_OWNER))
        return super().reducer_override(obj)


def dumps_for_client(value: Any, session: Session) -> bytes:
    buf = io.BytesIO()
    _ToClientPickler(buf, session).dump(value)
    return buf.getvalue()


class ProxyService(pb_grpc.ClientProxyServicer):
    """Runs client Driver calls with this process's driver connection."""

    def __init__(self, driver: CoreDriver) -> None:
        self.driver = driver
        self.sessions: dict[bytes, Session] = {}
        self.ops: dict[str, Callable[[Session, Any], Any]] = {
            name: self._forward(name) for name in DRIVER_CALLS
        }
        self.ops.update(
            {
                "connect": self._connect,
                "create_actor": self._create_actor,
                "release": self._release,
                "disconnect": self._disconnect,
            }
        )

    def _forward(self, name: str) -> Callable[[Session, Any], Any]:
        method = getattr(self.driver, name)
        return lambda s, args: method(*args)

    async def Call(self, request: pb.ClientRequest, context: Any) -> pb.ClientReply:
        op = self.ops.get(request.op)
        if op is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, f"unknown client operation {request.op!r}"
            )
        session = self.sessions.get(request.session)
        if session is None:
            if request.op != "connect":
                err = ConnectionError(
                    "the client session is gone (the cluster's head or proxy restarted); "
                    "call nbcluster.init() again"
                )
                return pb.ClientReply(payload=cloudpickle.dumps(err), is_error=True)
            session = Session(request.session or os.urandom(16))
            self.sessions[session.sid] = session
        session.last_seen = time.monotonic()
        return await asyncio.to_thread(self._run, session, op, request.payload)

    def _run(
        self, session: Session, op: Callable[[Session, Any], Any], payload: bytes
    ) -> pb.ClientReply:
        token = _current_session.set(session)
        try:
            args = cloudpickle.loads(payload) if payload else None
            result = op(session, args)
            return pb.ClientReply(payload=dumps_for_client(result, session))
        except BaseException as e:  # noqa: BLE001 - delivered to the client
            try:
                data = cloudpickle.dumps(e)
            except Exception:  # noqa: BLE001
                data = cloudpickle.dumps(exc.NbclusterSystemError(repr(e)))
            return pb.ClientReply(payload=data, is_error=True)
        finally:
            _current_session.reset(token)

    # -- operations that are not plain Driver calls ---------------------------------------------
    def _connect(self, s: Session, args: Any) -> dict[str, Any]:
        client = self.driver.client
        return {
            "session": s.sid,
            "address": client.head_address,
            "session_dir": client.session_dir,
            "node_id": client.node_id.hex(),
            "job_id": client.job_id.hex(),
            "started_here": False,
        }

    def _create_actor(self, s: Session, args: tuple[Any, ...]) -> ActorRecord:
        record = self.driver.create_actor(*args)
        if record.owned:  # the session holds it: it lives until the client lets go
            self.driver.add_actor_handle(record.actor_id)
            s.actors.add(record.actor_id)
        return ActorRecord(record.actor_id, record.meta, owned=False)

    def _release(self, s: Session, ids: list[bytes]) -> None:
        with s.lock:
            for oid in ids:
                s.refs.pop(oid, None)

    def _drop(self, s: Session) -> None:
        self.sessions.pop(s.sid, None)
        for actor_id in s.actors:
            self.driver.remove_actor_handle(actor_id)
        s.actors.clear()

    def _disconnect(self, s: Session, args: Any) -> None:
        self._drop(s)

    async def reap_idle(self) -> None:
        """Drop sessions whose client has been silent for SESSION_IDLE_S."""
        while True:
            await asyncio.sleep(30)
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if now - s.last_seen > SESSION_IDLE_S:
                    log.info("dropping idle client session %s", sid.hex()[:8])
                    self._drop(s)
