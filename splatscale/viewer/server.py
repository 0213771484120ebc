"""The viewer's web server: viser's, on a port checked first."""

from __future__ import annotations

import errno
import ipaddress
import socket

from splatscale.errors import SplatscaleError
from splatscale.messages import notice

LOCAL = "127.0.0.1"
DEFAULT_PORT = 8080


def check_port(host: str | None, port: int | None) -> None:
    """Refuse, naming the port, unless ``host:port`` (None: the defaults) can be bound
    now. viser itself would quietly move to the next free port."""
    host, port = _where(host, port)
    if not host.strip():
        raise SplatscaleError("--host: empty; name an address (127.0.0.1, the default, or "
                              "0.0.0.0 to share the page)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As asyncio's servers do: a port left in TIME_WAIT by a closed run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise SplatscaleError(f"--port {port}: already in use on {host}; choose "
                                      "another port (or stop what serves there)") from None
            raise SplatscaleError(f"--host {host} --port {port}: cannot serve there: "
                                  f"{error.strerror or error}") from None


def open_server(host: str | None, port: int | None):
    """viser's server on ``host:port`` (None: the defaults; port 0: any free one),
    checked to be where asked."""
    import rich
    import viser

    check_port(host, port)
    host, port = _where(host, port)
    # viser prints a banner and its stopping to stdout, which carries a command's JSON
    # report; the address is said by the caller instead.
    rich.reconfigure(quiet=True)
    server = viser.ViserServer(host=host, port=port, verbose=False)
    if port and server.get_port() != port:  # taken between the check and the bind
        server.stop()
        raise SplatscaleError(f"--port {port}: already in use on {host}; choose another port")
    if not _loopback(host):
        notice(f"the viewer serves on {host}: anyone who can reach this machine's port "
               f"{server.get_port()} can watch and control this run")
    return server


def _where(host: str | None, port: int | None) -> tuple[str, int]:
    return LOCAL if host is None else host, DEFAULT_PORT if port is None else port


def _loopback(host: str) -> bool:
    """Whether every address ``host`` names is this machine's loopback."""
    try:
        # a host's addresses are IPv4 or IPv6 ones: each sockaddr starts with its text
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def url(server) -> str:
    host = server.get_host()
    shown = "localhost" if host in (LOCAL, "0.0.0.0", "::") else host
    if ":" in shown:  # an IPv6 address
        shown = f"[{shown}]"
    return f"http://{shown}:{server.get_port()}"
