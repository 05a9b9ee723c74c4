"""The emulator's HTTP surface: a loopback server with one tracked thread per connection, and its handler.

Every request is handed to the owning emulator's ``handle``; the settings
here (address, link defaults, control prefix) are shared with
:class:`EmulatorProcess`, which drives a child's server over the same HTTP.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import sys
import threading
import time
from typing import Any, Protocol

from .script import ConnectionRecord

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
# close() shuts the open connections again after this long, for one whose socket changed meanwhile (TLS).
CLOSE_ROUND_S = 0.1
# How often serve_forever looks for shutdown() (its default, 0.5 s, is half a second per close in a test).
SHUTDOWN_POLL_S = 0.05
CONTROL_PREFIX = "_emulator/"


class _Backend(Protocol):
    """What the server serves for: the ``Emulator`` that answers each request."""

    def handle(self, h: Handler, method: str) -> None: ...

    def opened(self, record: ConnectionRecord) -> None: ...


class ClientGone(Exception):
    """The client closed its end while we wrote."""


class Server(http.server.ThreadingHTTPServer):
    """One thread per connection, each tracked (with its :class:`ConnectionRecord`) so close() can end it.

    With ``tls`` (a server-side ``ssl.SSLContext``) each connection's thread
    does the handshake first; a client that refuses the certificate ends it.
    """

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True

    def __init__(self, emulator: _Backend, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.emulator = emulator
        self.tls = tls
        self._live: dict[threading.Thread, tuple[socket.socket, ConnectionRecord]] = {}
        self._live_lock = threading.Lock()
        self._accepted = 0
        super().__init__((LOOPBACK, port), Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="emulator-conn", daemon=True
        )
        with self._live_lock:
            self._accepted += 1
            record = ConnectionRecord(self._accepted)
            self._live[thread] = (request, record)
        self.emulator.opened(record)
        thread.start()

    def record_of_this_thread(self) -> ConnectionRecord:
        """The record of the connection the calling thread serves."""
        with self._live_lock:
            return self._live[threading.current_thread()][1]

    def open_connections(self) -> int:
        """Connections whose thread still runs."""
        with self._live_lock:
            return len(self._live)

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        thread = threading.current_thread()
        try:
            if self.tls is not None:
                # the wrapper takes the socket over: close() must find it there, mid-handshake too
                request = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
                with self._live_lock:
                    record = self._live[thread][1]
                    self._live[thread] = (request, record)
                try:
                    request.do_handshake()
                except (ssl.SSLError, OSError):
                    request.close()
                    return  # a client that refused the certificate, or close() during the handshake
                record.session_reused = request.session_reused
            self.process_request_thread(request, client_address)
        finally:
            with self._live_lock:
                _, record = self._live.pop(thread)
            record.closed_s = time.monotonic()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up between requests is normal for a store; anything else is printed."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, ssl.SSLError)):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """Shut every open connection's socket and wait for its thread.

        In rounds: a TLS connection swaps its socket for the wrapped one as
        its handshake starts, so one shut a moment before (the bare socket,
        already handed over) is shut again, as the wrapper, in the next round.
        """
        deadline = time.monotonic() + STOP_JOIN_S
        while True:
            with self._live_lock:
                live = list(self._live.items())
            if not live or time.monotonic() >= deadline:
                return
            for _, (sock, _) in live:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            round_end = min(deadline, time.monotonic() + CLOSE_ROUND_S)
            for thread, _ in live:
                thread.join(max(0.0, round_end - time.monotonic()))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes; with Nagle on, the body
    # waits for the client's delayed ACK (~40 ms on Linux) on every request
    disable_nagle_algorithm = True
    server: Server
    record: ConnectionRecord
    raw_requestline: bytes  # (set by BaseHTTPRequestHandler as it reads the request line)

    def setup(self) -> None:
        super().setup()
        self.record = self.server.record_of_this_thread()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass

    def do_GET(self) -> None:
        self.server.emulator.handle(self, "GET")

    def do_HEAD(self) -> None:
        self.server.emulator.handle(self, "HEAD")

    def do_POST(self) -> None:
        self.server.emulator.handle(self, "POST")
