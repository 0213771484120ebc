"""The viewer's web server: viser's, on a port checked first."""

from __future__ import annotations

import errno
import socket

from splatscale.errors import SplatscaleError
from splatscale.messages import notice

LOCAL = "127.0.0.1"


def check_port(host: str, port: int) -> None:
    """Refuse, naming the port, unless ``host:port`` can be bound now. viser itself
    would quietly move to the next free port."""
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


def open_server(host: str, port: int):
    """viser's server on ``host:port`` (port 0: any free one), checked to be where asked."""
    import rich
    import viser

    check_port(host, port)
    # viser prints a banner and its stopping to stdout, which carries a command's JSON
    # report; the address is said by the caller instead.
    rich.reconfigure(quiet=True)
    server = viser.ViserServer(host=host, port=port, verbose=False)
    if port and server.get_port() != port:  # taken between the check and the bind
        server.stop()
        raise SplatscaleError(f"--port {port}: already in use on {host}; choose another port")
    if host != LOCAL:
        notice(f"the viewer serves on {host}: anyone who can reach this machine's port "
               f"{server.get_port()} can watch and control this run")
    return server


def url(server) -> str:
    host = server.get_host()
    shown = "localhost" if host in (LOCAL, "0.0.0.0", "::") else host
    return f"http://{shown}:{server.get_port()}"
