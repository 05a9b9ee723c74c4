"""The emulator's HTTP surface: a loopback server with one tracked thread per connection, and its handler.

Every request is handed to the owning emulator's ``handle``; the settings
here (address, link defaults, control prefix) are shared with
:class:`EmulatorProcess`, which drives a child's server over the same HTTP.
"""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
from typing import Any, Protocol

__all__ = ["ClientGone", "Handler", "Server"]

LOOPBACK = "127.0.0.1"
# A same-region object-store GET's time to first byte is a few tens of ms.
DEFAULT_LATENCY_S = 0.030
DEFAULT_JITTER_S = 0.005
# Listen backlog: the default of 5 drops SYNs when a loader opens dozens of
# connections at once, and a dropped SYN costs a 1 s retransmit.
LISTEN_BACKLOG = 512
# How long close() waits for each connection thread after shutting its socket.
STOP_JOIN_S = 5.0
# How often the serving thread looks for close()'s shutdown: socketserver's default (0.5 s) made every
# close wait up to half a second, which a test suite starting one emulator per test pays each time.
SHUTDOWN_POLL_S = 0.05
CONTROL_PREFIX = "_emulator/"


class _Backend(Protocol):
    """What the server serves for: the ``Emulator`` that answers each request."""

    def handle(self, h: Handler, method: str) -> None: ...


class ClientGone(Exception):
    """The client closed its end while we wrote."""


class Server(http.server.ThreadingHTTPServer):
    """One thread per connection, each tracked so close() can end it."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True

    def __init__(self, emulator: _Backend, port: int) -> None:
        self.emulator = emulator
        self._live: dict[threading.Thread, socket.socket] = {}
        self._live_lock = threading.Lock()
        super().__init__((LOOPBACK, port), Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="emulator-conn", daemon=True
        )
        with self._live_lock:
            self._live[thread] = request
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._live_lock:
                self._live.pop(threading.current_thread(), None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up between requests is normal for a store; anything else is printed."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """Shut every open connection's socket and wait for its thread."""
        with self._live_lock:
            live = list(self._live.items())
        for _, sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_JOIN_S
        for thread, _ in live:
            thread.join(max(0.0, deadline - time.monotonic()))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes; with Nagle on, the body
    # waits for the client's delayed ACK (~40 ms on Linux) on every request
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass

    def do_GET(self) -> None:
        self.server.emulator.handle(self, "GET")

    def do_HEAD(self) -> None:
        self.server.emulator.handle(self, "HEAD")

    def do_POST(self) -> None:
        self.server.emulator.handle(self, "POST")
