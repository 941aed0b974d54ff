"""A listening test server's accept loop."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def accept_each(sock: socket.socket, stop: threading.Event, handle: Callable[[socket.socket], None]) -> None:
    """Hand every connection `sock` accepts to handle(conn) until `stop` is set or the socket is closed."""
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        handle(conn)
