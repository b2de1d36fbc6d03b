"""The client-mode proxy: a driver on the head's host that runs API calls for remote clients.

A notebook that can reach only the head talks to ``ClientProxy/Call`` on the head's port;
the head relays the bytes to this process. Here payloads are unpickled (this is a driver:
it runs user code anyway), the call is made with the ordinary API, and the result is
pickled back. Objects and actors stay owned by this process, per client session, until the
client releases them or disconnects; so a client whose link drops for a while finds its
work intact when it comes back.
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

import nbcluster
from nbcluster._actor import ActorClass, ActorHandle
from nbcluster._refs import ObjectRef
from nbcluster._remote import RemoteFunction
from nbcluster._runtime import context
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster._runtime.serialization import function_hash

log = logging.getLogger(__name__)

CLIENT_OWNER = "client-proxy"
SESSION_IDLE_S = 600.0

_current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "nbc_proxy_session", default=None
)


class Session:
    """What one client holds: its refs, actor handles and cached functions."""

    def __init__(self, sid: bytes) -> None:
        self.sid = sid
        self.refs: dict[bytes, ObjectRef] = {}
        self.actors: dict[bytes, ActorHandle] = {}
        self.functions: dict[bytes, RemoteFunction[Any]] = {}
        self.classes: dict[bytes, ActorClass[Any]] = {}
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
            raise nbcluster.exceptions.ObjectFreedError(oid.hex(), "the client released this ref")
        return ref


def resolve_client_ref(oid: bytes) -> ObjectRef | None:
    """Called when a client's ref is unpickled here: the real ref of the session."""
    session = _current_session.get()
    return None if session is None else session.resolve(oid)


context.client_ref_resolver = resolve_client_ref


class _ToClientPickler(cloudpickle.CloudPickler):
    """Pickles results for the client: real refs and handles become client-side stand-ins."""

    def __init__(self, file: io.BytesIO, session: Session) -> None:
        super().__init__(file, protocol=5)
        self.session = session

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, ObjectRef):
            from nbcluster._refs import _rebuild_ref

            return (_rebuild_ref, (self.session.register(obj), CLIENT_OWNER))
        if isinstance(obj, ActorHandle):
            self.session.actors[obj._actor_id] = obj
            from nbcluster._actor import _rebuild_handle

            return (_rebuild_handle, (obj._actor_id, obj._meta))
        return super().reducer_override(obj)


def dumps_for_client(value: Any, session: Session) -> bytes:
    buf = io.BytesIO()
    _ToClientPickler(buf, session).dump(value)
    return buf.getvalue()


class ProxyService(pb_grpc.ClientProxyServicer):
    """Runs client API calls with this process's driver connection."""

    def __init__(self) -> None:
        self.sessions: dict[bytes, Session] = {}
        self.ops: dict[str, Callable[[Session, Any], Any]] = {
            "connect": self._connect,
            "put": self._put,
            "get": self._get,
            "wait": self._wait,
            "task": self._task,
            "actor_create": self._actor_create,
            "actor_call": self._actor_call,
            "get_actor": self._get_actor,
            "kill": self._kill,
            "cancel": self._cancel,
            "release": self._release,
            "disconnect": self._disconnect,
            "nodes": lambda s, a: nbcluster.nodes(),
            "cluster_resources": lambda s, a: nbcluster.cluster_resources(),
            "available_resources": lambda s, a: nbcluster.available_resources(),
        }

    async def Call(self, request: pb.ClientRequest, context: Any) -> pb.ClientReply:
        op = self.ops.get(request.op)
        if op is None:
            import grpc

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
                data = cloudpickle.dumps(nbcluster.exceptions.NbclusterSystemError(repr(e)))
            return pb.ClientReply(payload=data, is_error=True)
        finally:
            _current_session.reset(token)

    # -- operations -------------------------------------------------------------------------
    def _connect(self, s: Session, args: Any) -> dict[str, Any]:
        from nbcluster import state

        return {"session": s.sid, **state.session_info()}

    def _put(self, s: Session, value: Any) -> ObjectRef:
        return nbcluster.put(value)

    def _get(self, s: Session, args: tuple[list[ObjectRef], float | None]) -> list[Any]:
        refs, timeout = args
        return nbcluster.get(refs, timeout=timeout)

    def _wait(self, s: Session, args: tuple[list[ObjectRef], int, float | None]) -> list[bytes]:
        refs, num_returns, timeout = args
        ready, _ = nbcluster.wait(refs, num_returns=num_returns, timeout=timeout)
        return [r.binary() for r in ready]

    def _task(self, s: Session, args: tuple[bytes, Any, tuple[Any, ...], dict[str, Any]]) -> Any:
        payload, opts, a, kw = args
        key = function_hash(payload)
        rf = s.functions.get(key)
        if rf is None:
            rf = s.functions[key] = RemoteFunction(cloudpickle.loads(payload), opts)
        return rf._remote(a, kw, opts)

    def _actor_create(
        self, s: Session, args: tuple[bytes, Any, tuple[Any, ...], dict[str, Any]]
    ) -> ActorHandle:
        payload, opts, a, kw = args
        key = function_hash(payload)
        ac = s.classes.get(key)
        if ac is None:
            ac = s.classes[key] = ActorClass(cloudpickle.loads(payload), opts)
        handle = ac._create(a, kw, opts)
        s.actors[handle._actor_id] = handle
        return handle

    def _handle(self, s: Session, actor_id: bytes, meta: dict[str, Any]) -> ActorHandle:
        h = s.actors.get(actor_id)
        if h is None:
            h = s.actors[actor_id] = ActorHandle._new(
                actor_id, meta, nbcluster._api.context.require_client(), owned=False
            )
        return h

    def _actor_call(
        self,
        s: Session,
        args: tuple[Any, ...],
    ) -> Any:
        actor_id, meta, method, a, kw, n = args[:6]
        call_options = args[6] if len(args) > 6 else {}  # concurrency_group, enable_task_events
        return self._handle(s, actor_id, meta)._call(method, a, kw, n, **call_options)

    def _get_actor(self, s: Session, args: tuple[str, str | None]) -> ActorHandle:
        h = nbcluster.get_actor(args[0], namespace=args[1])
        s.actors[h._actor_id] = h
        return h

    def _kill(self, s: Session, args: tuple[bytes, dict[str, Any], bool]) -> None:
        actor_id, meta, no_restart = args
        nbcluster.kill(self._handle(s, actor_id, meta), no_restart=no_restart)

    def _cancel(self, s: Session, args: tuple[ObjectRef, bool]) -> None:
        nbcluster.cancel(args[0], force=args[1])

    def _release(self, s: Session, ids: list[bytes]) -> None:
        with s.lock:
            for oid in ids:
                s.refs.pop(oid, None)

    def _disconnect(self, s: Session, args: Any) -> None:
        self.sessions.pop(s.sid, None)

    async def reap_idle(self) -> None:
        """Drop sessions whose client has been silent for SESSION_IDLE_S."""
        while True:
            await asyncio.sleep(30)
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if now - s.last_seen > SESSION_IDLE_S:
                    log.info("dropping idle client session %s", sid.hex()[:8])
                    self.sessions.pop(sid, None)
