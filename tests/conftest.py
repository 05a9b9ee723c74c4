"""Shared fixtures: loopback servers and dataset writers."""

from __future__ import annotations

import email.utils
import http.server
import itertools
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from servers import LOOPBACK, S3Server, start_s3_server

if TYPE_CHECKING:
    import zarr.storage

_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    """One moto S3 server for the whole session, on 127.0.0.1 and a free port."""
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server; returns its name."""
    name = f"bucket-{next(_bucket_ids)}"
    s3_server.create_bucket(name)
    return name


# --- loopback HTTP file server (stores tests) --------------------------------

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class HTTPFileServer:
    """A threaded HTTP server on 127.0.0.1 serving ``root`` read-only, with Range and HEAD."""

    root: Path
    url: str
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, path: str, byte_range: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, byte_range))


def _file_handler(server: HTTPFileServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _fail(self, status: int, extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _serve(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            byte_range = self.headers.get("Range")
            server.record(self.command, path, byte_range)
            target = (server.root / path.lstrip("/")).resolve()
            if server.root not in target.parents or not target.is_file():
                self._fail(404)
                return
            stat = target.stat()
            size = stat.st_size
            start, stop, status = 0, size, 200
            if byte_range is not None:
                match = _RANGE.match(byte_range.strip())
                if match is None or match.groups() == ("", ""):
                    self._fail(400)
                    return
                first, last = match.groups()
                if first == "":  # suffix range: the last N bytes
                    start = max(size - int(last), 0)
                else:
                    start = int(first)
                    stop = min(int(last) + 1, size) if last else size
                if start >= size or start >= stop:
                    self._fail(416, {"Content-Range": f"bytes */{size}"})
                    return
                status = 206
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(stop - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
            self.send_header("ETag", f'"{stat.st_mtime_ns:x}-{size:x}"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
            self.end_headers()
            if body:
                with open(target, "rb") as f:
                    f.seek(start)
                    self.wfile.write(f.read(stop - start))

    return Handler


@pytest.fixture
def http_server(tmp_path: Path) -> HTTPFileServer:
    """Serve a fresh directory (``.root``) at ``.url`` on 127.0.0.1 and a free port."""
    root = (tmp_path / "http-root").resolve()
    root.mkdir()
    server = HTTPFileServer(root=root, url="")
    httpd = http.server.ThreadingHTTPServer((LOOPBACK, 0), _file_handler(server))
    httpd.daemon_threads = True
    server.url = f"http://{LOOPBACK}:{httpd.server_address[1]}"
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="test-http-server", daemon=True
    )
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


# --- parallel-write tests ------------------------------------------------------


@pytest.fixture
def write_s3_store(s3_server: S3Server, s3_bucket: str) -> zarr.storage.ObjectStore:
    """A writable zarr ``ObjectStore`` over a fresh bucket of the loopback S3 server (picklable)."""
    import zarr.storage
    from obstore.store import S3Store

    options = s3_server.client_options()
    raw = S3Store(
        s3_bucket,
        endpoint=options["endpoint"],
        access_key_id=options["access_key_id"],
        secret_access_key=options["secret_access_key"],
        region=options["region"],
        client_options={"allow_http": options["allow_http"]},
    )
    return zarr.storage.ObjectStore(raw)


# --- the benchmark's loopback object store, with fault injection ------------------


@pytest.fixture
def emulator(tmp_path: Path):
    """``insitubatch.testing.emulator.Emulator`` over a fresh directory (``.root``) on 127.0.0.1, no added latency.

    The same server the benchmarks measure against: write a zarr under
    ``.root``, read it at ``.url_for(name)``, and ``.inject(kind, key_glob, ...)``
    faults (500/503/403/404, retry-after, reset, truncate, stall).
    """
    from insitubatch.testing.emulator import Emulator

    root = tmp_path / "emulator-root"
    root.mkdir()
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        yield emu
