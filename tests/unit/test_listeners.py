"""Listening sockets bound without the event loop's ``getaddrinfo`` (``netaddr.numeric_listener``).

Under uvloop a ``getaddrinfo`` runs on libuv's thread pool, whose first use starts four
threads: every worker that listened on ``127.0.0.1`` through the loop started them at spawn.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from nbcluster._runtime.netaddr import numeric_listener


def test_an_ip_address_gets_a_bound_non_blocking_listener() -> None:
    sock = numeric_listener("127.0.0.1")
    assert sock is not None
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        assert not sock.getblocking()
        with socket.create_connection((host, port), timeout=5):
            pass  # it listens
    finally:
        sock.close()


def test_an_ipv6_address_gets_an_ipv6_listener() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this interpreter")
    try:
        sock = numeric_listener("::1")
    except OSError as err:  # a kernel or namespace without ::1
        pytest.skip(f"no IPv6 loopback here: {err}")
    assert sock is not None
    with sock:
        assert sock.family == socket.AF_INET6


@pytest.mark.parametrize("host", ["localhost", "example.invalid", ""])
def test_a_host_name_is_left_to_the_loop(host: str) -> None:
    assert numeric_listener(host) is None


def test_task_channel_and_control_servers_on_uvloop_start_no_libuv_threads() -> None:
    """In a fresh process (no earlier test started the pool): a worker's task-channel
    server and a control-channel server listen on 127.0.0.1, and the process has no
    ``libuv-worker`` thread."""
    pytest.importorskip("uvloop")
    code = textwrap.dedent(
        """
        import asyncio, os
        from nbcluster._runtime.core.channel import ChannelServer
        from nbcluster._runtime.loops import new_event_loop
        from nbcluster._runtime.protocol.ctrl import CtrlServer

        async def serve(*args):
            return None

        async def main():
            server = ChannelServer("t" * 64, serve, max_frame=1 << 20, local=False)
            address = await server.start("127.0.0.1")
            ctrl = await CtrlServer("t" * 64, {}, max_frame=1 << 20).start("127.0.0.1")
            names = [
                open(f"/proc/self/task/{t}/comm").read().strip()
                for t in os.listdir("/proc/self/task")
            ]
            print(address, ctrl, names.count("libuv-worker"))

        loop = new_event_loop()
        print(type(loop).__module__)
        loop.run_until_complete(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split("\n")
    assert out[0].startswith("uvloop"), out
    address, ctrl, threads = out[1].split()
    assert address.startswith("127.0.0.1:") and ctrl.startswith("127.0.0.1:")
    assert threads == "0"
