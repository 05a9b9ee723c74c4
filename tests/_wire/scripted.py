"""Loopback servers and helpers the wire tests share: every case runs through each client in ``WIRE_CLIENTS``.

* :class:`Scripted`: a raw-socket server whose every connection runs a
  script (any framing, any misbehaviour), optionally over TLS;
* :class:`FileServer`: an asyncio HTTP server of a directory (ranges,
  HEAD, a required token, redirects to another server), counting the
  connections it holds;
* :func:`read_through`: one key read through the store's client the way a
  pass reads it (``client_for`` + ``Fetcher``), with the client chosen by
  ``obstore_store(..., client=name)``;
* :func:`start_signed_s3`: moto's S3 server checking every signature.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import os
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from servers import LOOPBACK, free_port

from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.store_link import client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store

# The clients every differential case runs through; a third is one more name here.
WIRE_CLIENTS = ("engine", "obstore")
# Retries a case allows: enough to see a transient fault retried, few enough to fail in seconds.
FEW_RETRIES: dict[str, Any] = {"max_retries": 2, "retry_timeout": datetime.timedelta(seconds=4)}
# Every wait on a loopback server is bounded by this (a loaded 2-core machine).
WAIT_S = 20.0
# how often a socketserver's serve_forever looks for shutdown() (its default, 0.5 s, is a second per test of two)
SHUTDOWN_POLL_S = 0.05


@dataclass
class Request:
    """One request as a server saw it."""

    method: str
    target: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


def parse_request(head: bytes) -> Request:
    lines = head.decode("latin-1").split("\r\n")
    method, target = lines[0].split(" ")[:2]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return Request(method, target, headers)


def read_head(conn: socket.socket) -> bytes:
    """One request head from ``conn`` (b"" when the peer closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            piece = conn.recv(65536)
        except OSError:
            return b""
        if not piece:
            return b""
        data += piece
    return data


def answer(status: int, body: bytes = b"", **headers: str) -> bytes:
    """A whole HTTP/1.1 answer with ``Content-Length`` (``headers``: ``Content_Range="..."`` style names)."""
    lines = [f"HTTP/1.1 {status} X"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def ranged(body: bytes, header: str | None) -> bytes:
    """The right answer to a GET of ``body`` with Range ``header`` (one range, or none)."""
    if header is None:
        return answer(200, body)
    spec = header.split("=", 1)[1]
    first, _, last = spec.partition("-")
    if not first:
        start, stop = max(0, len(body) - int(last)), len(body)
    else:
        start, stop = int(first), min(len(body), int(last) + 1 if last else len(body))
    if start >= len(body):
        return answer(416, Content_Range=f"bytes */{len(body)}")
    return answer(206, body[start:stop], Content_Range=f"bytes {start}-{stop - 1}/{len(body)}")


class Scripted(socketserver.ThreadingTCPServer):
    """A loopback server whose every connection runs ``script(conn, n)``: raw bytes, any framing.

    Or, with ``answers``, each request is answered with ``answers(request)``
    (``None`` closes the connection) and recorded in :attr:`requests`.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        script: Callable[[socket.socket, int], None] | None = None,
        tls: ssl.SSLContext | None = None,
        answers: Callable[[Request], bytes | None] | None = None,
    ) -> None:
        self.script = script or self._answering
        self.answers = answers
        self.connections = 0
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with outer.lock:
                    outer.connections += 1
                    n = outer.connections
                conn = self.request
                if tls is not None:
                    try:
                        conn = tls.wrap_socket(conn, server_side=True)
                    except (ssl.SSLError, OSError):
                        return  # a client that refused the certificate
                outer.script(conn, n)

        super().__init__((LOOPBACK, 0), Handler)

    def _answering(self, conn: socket.socket, n: int) -> None:
        assert self.answers is not None
        while head := read_head(conn):
            request = parse_request(head)
            with self.lock:
                self.requests.append(request)
            out = self.answers(request)
            if out is None:
                break
            try:
                conn.sendall(out)
            except OSError:
                break
        conn.close()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str = "", scheme: str = "http", host: str = LOOPBACK) -> str:
        return f"{scheme}://{host}:{self.port}/{path.lstrip('/')}"


def read_through(client: str, url: str, key: str, byte_range: Any = None, **store: Any) -> bytes | BaseException:
    """``key`` (``byte_range`` of it) read as a pass reads it, by ``client``; its bytes or the error raised."""
    store.setdefault("retry", FEW_RETRIES)
    opened = obstore_store(url, read_only=True, client=client, **store)
    try:
        reader = client_for(opened)
        assert reader.route.client == client, reader.route
        fetcher = Fetcher(reader, ReadWindow(4).user(4), PassCounters(), hedge=False)

        async def main() -> Any:
            return await asyncio.wait_for(fetcher.get(key, byte_range), WAIT_S)

        try:
            got = asyncio.run(main())
        except Exception as exc:
            return exc
        return None if got is None else got.to_bytes()  # type: ignore[return-value]
    finally:
        close_store(opened)
        gc.collect()  # a socket or transport this read left unclosed warns in this test, not in a later one


def read_many(
    client: str, url: str, reads: list[tuple[str, Any, int | None]], **store: Any
) -> list[bytes | None | BaseException]:
    """``reads`` (key, byte range, size hint) one after another through one store, as a pass reads them, by ``client``.

    Each result is the bytes, ``None`` for a missing key, or the error raised.
    """
    store.setdefault("retry", FEW_RETRIES)
    opened = obstore_store(url, read_only=True, client=client, **store)
    try:
        reader = client_for(opened)
        assert reader.route.client == client, reader.route
        fetcher = Fetcher(reader, ReadWindow(4).user(4), PassCounters(), hedge=False)

        async def one(key: str, byte_range: Any, size_hint: int | None) -> bytes | None | BaseException:
            try:
                got = await asyncio.wait_for(fetcher.get(key, byte_range, size_hint), WAIT_S)
            except Exception as exc:
                return exc
            return None if got is None else got.to_bytes()

        async def main() -> list[bytes | None | BaseException]:
            return [await one(*read) for read in reads]

        return asyncio.run(main())
    finally:
        close_store(opened)
        gc.collect()  # a socket or transport these reads left unclosed warns in this test, not in a later one


# What an S3 client wants besides the length (object_store reads both from a GET's answer).
_DATED = 'Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\nETag: "0"\r\n'


def _abort_every_connection(loop: asyncio.AbstractEventLoop) -> None:
    """Abort every connection ``loop`` still holds, a handler started for it or not.

    A TLS connection still in its handshake has no handler yet (and Python
    before 3.13 has no ``Server.abort_clients``), and one accepted as the
    server closes can have its handler cancelled before it starts: only the
    selector loop's own table of transports reaches those.
    """
    for transport in _transports(loop):
        transport.abort()  # (a closing one too: close() waits for its unsent bytes, a client may never read them)


def _transports(loop: asyncio.AbstractEventLoop) -> list[asyncio.BaseTransport]:
    return [t for t in list(getattr(loop, "_transports", {}).values()) if t is not None]


def _open_sockets(loop: asyncio.AbstractEventLoop) -> list[str]:
    """The transports of ``loop`` whose sockets are still open."""
    return [
        repr(t) for t in _transports(loop) if (sock := t.get_extra_info("socket")) is not None and sock.fileno() >= 0
    ]


@dataclass
class FileServer:
    """An asyncio HTTP/1.1 server of ``root`` on loopback, in its own thread; counts the connections it holds.

    ``token``: a query string every request must carry (else 403);
    ``redirect_to``: a base URL chunk requests (paths with ``/c/``) are sent to with a 302;
    ``tls``: a server context (HTTPS); ``quirk(request)``: an answer that replaces the right one, or ``None``.
    """

    root: Path
    token: str | None = None
    redirect_to: str | None = None
    tls: ssl.SSLContext | None = None
    quirk: Callable[[Request], bytes | None] | None = None
    open_connections: int = 0
    connections: int = 0
    requests: list[Request] = field(default_factory=list)
    left_open: list[str] = field(default_factory=list)  # (none, once closed)

    def __post_init__(self) -> None:
        self._writers: dict[asyncio.StreamWriter, asyncio.Task | None] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(WAIT_S):
            raise RuntimeError("the file server did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, LOOPBACK, 0, ssl=self.tls))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        # stopped by close(): a connection accepted as the server closed becomes a transport first (its
        # accepting task, cancelled before it ran, would drop the bare socket), then every task left (a handler,
        # a TLS handshake) ends, and every transport with it
        self._loop.run_until_complete(asyncio.sleep(0.05))
        _abort_every_connection(self._loop)
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        _abort_every_connection(self._loop)
        self._loop.run_until_complete(asyncio.sleep(0.05))
        self.left_open = _open_sockets(self._loop)
        self._loop.close()

    def url(self, path: str = "", host: str = LOOPBACK) -> str:
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://{host}:{self.port}/{path.lstrip('/')}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        self.connections += 1
        self._writers[writer] = asyncio.current_task()
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                    break
                request = parse_request(head)
                self.requests.append(request)
                writer.write(self._answer(request))
                await writer.drain()
        except asyncio.CancelledError:  # closed by close(): end quietly (asyncio logs a handler that ends cancelled)
            pass
        finally:
            self.open_connections -= 1
            self._writers.pop(writer, None)
            writer.transport.abort()

    def _answer(self, request: Request) -> bytes:
        odd = None if self.quirk is None else self.quirk(request)
        if odd is not None:
            return odd
        if self.token is not None and request.query != self.token:
            return answer(403, b"<Error>AuthenticationFailed</Error>")
        if self.redirect_to is not None and "/c/" in request.path:
            return answer(302, Location=f"{self.redirect_to.rstrip('/')}{request.path}")
        file = self.root / unquote(request.path).lstrip("/")
        if not file.is_file():
            return answer(404)
        body = file.read_bytes()
        if request.method == "HEAD":
            return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{_DATED}\r\n".encode()
        return ranged(body, request.headers.get("range")).replace(b"\r\n", f"\r\n{_DATED}".encode(), 1)

    async def _shutdown(self) -> None:
        self._server.close()
        for writer, handler in list(self._writers.items()):
            writer.transport.abort()
            if handler is not None:
                handler.cancel()
        await asyncio.gather(*(h for h in self._writers.values() if h is not None), return_exceptions=True)
        _abort_every_connection(self._loop)
        if hasattr(self._server, "abort_clients"):  # Python >= 3.13: connections never handed to a handler too
            self._server.abort_clients()  # (a TLS one still in its handshake), or wait_closed() waits for them
        await self._server.wait_closed()
        for _ in range(5):  # an aborted transport's socket is released a loop turn later (a TLS one, a few)
            await asyncio.sleep(0.01)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the file server's thread did not end"
        assert not self.left_open, f"the file server left connections open: {self.left_open}"
        gc.collect()  # (as read_through: what this server's test left unclosed warns in it)


@dataclass
class SignedS3:
    """moto's S3 server with IAM on: a request whose signature does not verify is refused (403)."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    process: subprocess.Popen

    def options(self, **extra: Any) -> dict[str, Any]:
        """Keyword options for ``obstore_store`` (``s3://bucket``) with these keys."""
        keys = {"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key}
        return {"endpoint": self.endpoint, "allow_http": True, "region": "us-east-1", **keys, **extra}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


# moto checks signatures once this many requests have passed unchecked: the IAM user, its key and its policy.
_UNCHECKED_SETUP_ACTIONS = 3


def start_signed_s3() -> SignedS3:
    """Start moto with signature checks, and make a user whose keys may do anything."""
    import boto3

    port = free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_UNCHECKED_SETUP_ACTIONS))
    env.update(AWS_ACCESS_KEY_ID="setup", AWS_SECRET_ACCESS_KEY="setup")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as resp:
                resp.read()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError(f"moto did not answer on {endpoint}") from None
            time.sleep(0.1)
    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="s", aws_secret_access_key="s"
    )
    iam.create_user(UserName="reader")
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(policy))
    return SignedS3(endpoint, key["AccessKeyId"], key["SecretAccessKey"], process)


def host_of(url: str) -> str:
    return urlsplit(url).netloc
