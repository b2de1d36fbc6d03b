"""Which address of this host does another host reach us through?

Ray's answer (``ray._private.services.get_node_ip_address``): open a UDP socket "towards"
the other host and read the local address the kernel picked for that route. No packet is
sent: ``connect`` on a UDP socket only chooses the route. A node joining a head at
``10.0.0.1:7000`` from a host whose interface on that network is ``10.0.0.2`` therefore
listens on and advertises ``10.0.0.2``; a node joining a head on loopback stays on loopback.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["split_host_port", "route_address", "numeric_listener"]


def split_host_port(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → (host, port); a clear ``ValueError`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def route_address(host: str, port: int = 9) -> str:
    """The local IP address on the route to ``host`` (the port only helps pick a family)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as err:
        raise OSError(f"cannot resolve {host!r}: {err}") from None
    last: OSError | None = None
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect(sockaddr)  # picks the route; sends nothing
            except OSError as err:
                last = err
                continue
            return str(s.getsockname()[0])
    raise OSError(f"no route to {host}: {last}")


def numeric_listener(host: str, backlog: int = 100) -> socket.socket | None:
    """A non-blocking socket listening on an ephemeral port of ``host`` when ``host`` is an
    IP address; None for a host name (let the event loop resolve it).

    Handing the loop a bound socket skips its ``getaddrinfo``: under uvloop that call runs on
    libuv's thread pool, and its first use starts four threads in the process. A worker that
    listens on ``127.0.0.1`` would start them for nothing at every spawn.
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None
    sock = socket.create_server((host, 0), family=family, backlog=backlog)
    sock.setblocking(False)
    return sock
