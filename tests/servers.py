"""Real servers on loopback for tests: moto's standalone S3 server in a subprocess."""

from __future__ import annotations

import contextlib
import email.utils
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"
# moto's server takes a few seconds to import on a 2-core machine
S3_START_TIMEOUT_S = 60.0
# moto accepts any credentials; these are what every client in the tests sends
S3_KEY_ID = "testing"
S3_SECRET = "testing"
S3_REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running moto S3 server; ``endpoint`` is ``http://127.0.0.1:<port>``."""

    endpoint: str
    process: subprocess.Popen

    def client_options(self) -> dict[str, object]:
        """Keyword options for ``insitubatch.obstore_store`` / obstore's ``S3Store``."""
        return {
            "endpoint": self.endpoint,
            "allow_http": True,
            "access_key_id": S3_KEY_ID,
            "secret_access_key": S3_SECRET,
            "region": S3_REGION,
        }

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def reset(self) -> None:
        """Drop every bucket (moto's reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_s3_server() -> S3Server:
    """Start ``moto.server`` on a free loopback port and wait until it answers."""
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY_ID, AWS_SECRET_ACCESS_KEY=S3_SECRET)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + S3_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with code {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as resp:
                resp.read()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server on {endpoint} did not answer within {S3_START_TIMEOUT_S}s") from exc
            time.sleep(0.1)
    return S3Server(endpoint=endpoint, process=proc)


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


@contextlib.contextmanager
def serve_files(root: Path) -> Iterator[HTTPFileServer]:
    """Serve ``root`` read-only on 127.0.0.1 and a free port until the block ends."""
    server = HTTPFileServer(root=root, url="")
    httpd = http.server.ThreadingHTTPServer((LOOPBACK, 0), _file_handler(server))
    httpd.daemon_threads = True
    server.url = f"http://{LOOPBACK}:{httpd.server_address[1]}"
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="test-http-server", daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
