"""The head's relay for client mode: ``ClientProxy/Call`` bytes go to the proxy process.

The head does not unpickle them. The proxy (a driver on the head's host) is started on
the first client call and ends with the head (it watches a pipe the head holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc

from nbcluster._runtime import proc
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import authed_call, make_channel

METHOD = "/nbcluster.ClientProxy/Call"


class ClientRelay:
    """Starts the proxy on demand and forwards calls to it unchanged."""

    def __init__(self, session_dir: Path, token_file: str, token: str, head_address: str) -> None:
        self.session_dir = session_dir
        self.token_file = token_file
        self.token = token
        self.head_address = head_address
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Any = None
        self.call: Any = None
        self.lock = asyncio.Lock()
        self._pipe_r, self._pipe_w = os.pipe()
        os.set_inheritable(self._pipe_r, True)

    async def _ensure(self) -> Any:
        async with self.lock:
            if self.proc is not None and self.proc.poll() is None and self.call is not None:
                return self.call
            addr_file = self.session_dir / "proxy.addr"
            addr_file.unlink(missing_ok=True)
            log = open(self.session_dir / "logs" / "proxy.out", "ab")  # noqa: SIM115
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "nbcluster._runtime.proxy.main",
                    "--session-dir",
                    str(self.session_dir),
                    "--token-file",
                    self.token_file,
                    "--head-address",
                    self.head_address,
                    "--parent-fd",
                    str(self._pipe_r),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(self._pipe_r,),
                start_new_session=True,
            )
            log.close()
            p = self.proc
            text = await asyncio.to_thread(
                proc.wait_for_file, addr_file, 60, lambda: p.poll() is None
            )
            if self.channel is not None:
                await self.channel.close()
            address = text.strip()
            self.channel = make_channel(address, self.token)
            self.call = authed_call(
                self.channel.unary_unary(
                    METHOD, request_serializer=None, response_deserializer=None
                ),
                self.token,
                address,
            )
            return self.call

    async def forward(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            call = await self._ensure()
        except (RuntimeError, TimeoutError) as e:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"the client proxy could not start: {e}"
            )
        try:
            return await call(request, timeout=None)
        except RpcFailure as err:
            await context.abort(err.code(), err.details() or "proxy call failed")
        return b""  # pragma: no cover

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "nbcluster.ClientProxy",
            {"Call": grpc.unary_unary_rpc_method_handler(self.forward)},
        )

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._pipe_w)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.channel is not None:
            await self.channel.close()
