"""Which address of this host does another host reach us through?

Ray's answer (``ray._private.services.get_node_ip_address``): open a UDP socket "towards"
the other host and read the local address the kernel picked for that route. No packet is
sent: ``connect`` on a UDP socket only chooses the route. A node joining a head at
``10.0.0.1:7000`` from a host whose interface on that network is ``10.0.0.2`` therefore
listens on and advertises ``10.0.0.2``; a node joining a head on loopback stays on loopback.
"""

from __future__ import annotations

import socket

__all__ = ["split_host_port", "route_address"]


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
