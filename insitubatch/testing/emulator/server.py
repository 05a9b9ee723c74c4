"""A loopback object store: real HTTP on 127.0.0.1 with injected latency, bandwidth and faults.

The emulator serves a local directory tree (zarr groups written by
``insitubatch.testing.data``) the way a cloud bucket's HTTP endpoint does: ``GET`` with
optional single ``Range``, ``HEAD``, ``404`` for a missing key. zarr reads it
through obstore's ``HTTPStore``::

    with Emulator(root, latency_s=0.030) as emu:
        store = obstore_store(emu.url_for("era5.zarr"), read_only=True)

What it injects, all in the server's handler thread so the client sees real
sockets and real HTTP:

* **latency** — every request waits ``latency_s`` plus a uniform draw in
  ``[0, jitter_s]`` before the first byte of its response (time to first
  byte), so ``latency_s`` is a floor; ``tail_s`` adds an exponential draw
  of that mean (a heavy tail) and ``straggler_share`` of the requests wait
  ``straggler_s`` more (see :mod:`insitubatch.testing.emulator.link`).
* **throttling and silence** — ``throttle_share`` of GETs answered 503 with
  an S3 ``SlowDown`` body (in bursts with ``throttle_period_s`` /
  ``throttle_burst_s``); ``hold_share`` of GETs, and every GET of a key
  matching ``hold_key``, never answered until the client gives up.
* **bandwidth** — with ``bandwidth_bytes_per_s`` set, each body is written
  in slices of ``PACE_SLICE_BYTES`` no faster than that rate. One handler
  thread serves one keep-alive connection, so the cap is per connection,
  like a single object-store stream.
* **faults** (GET only) — :meth:`Emulator.inject` a :class:`Fault` of one of
  :data:`FAULT_KINDS` for keys matching a glob, with a probability and an
  optional count:

  ``"500"``, ``"503"``, ``"403"``, ``"404"``
      that status with a short text body;
  ``"retry-after"``
      503 with a ``Retry-After: retry_after_s`` header;
  ``"reset"``
      the full ``Content-Length`` announced, half the body sent, then a TCP
      reset (``SO_LINGER`` 0);
  ``"truncate"``
      the same, then a clean close (the client sees a short body);
  ``"stall"``
      half the body, then nothing for ``stall_s`` (or until the emulator
      closes), then a close — a client timeout shorter than ``stall_s`` fires.

Counters are exact: every request is counted on arrival, every body byte as
it goes out (before the write returns, so a client that has read a body
sees it counted), per key (the URL path without its leading ``/``). Read them
with :meth:`Emulator.stats`, zero them with :meth:`Emulator.reset_stats`.

Run from a shell, ``python -m insitubatch.testing.emulator ROOT`` (or
``insitubatch emulate ROOT``) serves ``ROOT`` in the foreground until
stopped (its ``__main__``); :mod:`insitubatch.testing.emulator.cli` says how.

:class:`EmulatorProcess` runs the same server in a child process
(``python -m insitubatch.testing.emulator``) so that a benchmark's loader and the server do
not share an interpreter; it is driven through two control endpoints the
server answers without counting them: ``GET /_emulator/stats`` (JSON) and
``POST /_emulator/reset``, plus ``POST /_emulator/config`` (JSON with any
link setting of :class:`~insitubatch.testing.emulator.link.LinkModel`).
Faults are injected in-process only.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import math
import os
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .handler import (
    CONTROL_PREFIX,
    DEFAULT_JITTER_S,
    DEFAULT_LATENCY_S,
    LOOPBACK,
    SHUTDOWN_POLL_S,
    STOP_JOIN_S,
    ClientGone,
    Handler,
    Server,
)
from .link import SLOWDOWN_BODY, LinkModel, wait_or_gone
from .stats import DEFAULT_RETRY_AFTER_S, DEFAULT_STALL_S, Counters, EmulatorStats, Fault

__all__ = ["FAULT_KINDS", "Emulator"]

# Paced bodies are written in slices this big (a socket-buffer-sized unit).
PACE_SLICE_BYTES = 64 * 1024

STATUS_FAULTS = {"500": 500, "503": 503, "403": 403, "404": 404}
BODY_FAULTS = ("reset", "truncate", "stall")
FAULT_KINDS = (*STATUS_FAULTS, "retry-after", *BODY_FAULTS)

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class Emulator:
    """The emulator server on ``127.0.0.1`` in a background thread of this process.

    Parameters
    ----------
    root
        Directory whose tree is served; ``/a/b`` is ``root/a/b``.
    latency_s, jitter_s
        Time to first byte: ``latency_s`` plus a uniform draw in ``[0, jitter_s]``.
    bandwidth_bytes_per_s
        Per-connection body rate; ``None`` is unpaced.
    port
        ``0`` picks a free port.
    seed
        Seeds the jitter and fault-probability draws.
    **link
        Any other link setting of :class:`~insitubatch.testing.emulator.link.LinkModel`
        (``tail_s``, ``straggler_share``, ``throttle_share``, ``hold_key``, ...).

    :meth:`configure` changes the link settings while the server runs (each
    request reads them when it arrives); ``emu.link`` holds them.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        latency_s: float = DEFAULT_LATENCY_S,
        jitter_s: float = DEFAULT_JITTER_S,
        bandwidth_bytes_per_s: float | None = None,
        port: int = 0,
        seed: int = 0,
        **link: Any,
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise NotADirectoryError(f"root={str(root)!r} is not a directory")
        self.link = LinkModel(seed)
        self.configure(latency_s=latency_s, jitter_s=jitter_s, bandwidth_bytes_per_s=bandwidth_bytes_per_s, **link)
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._counters = Counters()
        self._faults: list[Fault] = []
        self._closing = threading.Event()
        self._server = Server(self, port)
        self.port = int(self._server.server_address[1])
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, name="emulator", daemon=True
        )
        self._thread.start()
        self._closed = False

    # -- configuration ----------------------------------------------------------
    def configure(self, **settings: Any) -> dict[str, Any]:
        """Change link settings (``latency_s``, ``jitter_s``, ``bandwidth_bytes_per_s``, ``tail_s``, ...).

        Settings left out keep their value; returns them all. See
        :class:`~insitubatch.testing.emulator.link.LinkModel` for the names
        and what each does.
        """
        self.link.configure(**settings)
        return self.link.settings()

    def url_for(self, path: str) -> str:
        """The URL of ``path`` (relative to ``root``) on this server."""
        return f"{self.url}/{path.lstrip('/')}"

    # -- counters and faults --------------------------------------------------------
    def stats(self) -> EmulatorStats:
        """A snapshot of the counters since start or the last :meth:`reset_stats`."""
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        with self._counters.lock:
            self._counters.reset()

    def inject(
        self,
        kind: str,
        key: str = "*",
        *,
        probability: float = 1.0,
        times: int | None = None,
        retry_after_s: int = DEFAULT_RETRY_AFTER_S,
        stall_s: float = DEFAULT_STALL_S,
    ) -> Fault:
        """Make GETs of keys matching ``key`` fail as ``kind`` (see the module docstring).

        Rules are tried in the order they were injected; the first that
        matches and wins its probability draw applies. Returns the rule, whose
        ``fired`` counts its hits.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"kind={kind!r} is not a fault kind; valid kinds are {FAULT_KINDS}")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"{probability=} must be in [0, 1]")
        if times is not None and times < 1:
            raise ValueError(f"{times=} must be >= 1, or None for no limit")
        fault = Fault(kind, key, probability, times, retry_after_s, stall_s)
        with self._counters.lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._counters.lock:
            self._faults.clear()

    def _pick_fault(self, key: str) -> Fault | None:
        with self._counters.lock:
            for fault in self._faults:
                if fault.matches(key) and (fault.probability >= 1.0 or self._draw() < fault.probability):
                    fault.fired += 1
                    return fault
        return None

    def _draw(self) -> float:
        with self._rng_lock:
            return self._rng.random()

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving, end every connection (and any sleep in it), join the threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(STOP_JOIN_S)

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- request handling (connection threads) ----------------------------------------
    def handle(self, h: Handler, method: str) -> None:
        """Answer one request (called by the connection thread's handler)."""
        key = unquote(h.path.split("?", 1)[0]).lstrip("/")
        try:
            if key.startswith(CONTROL_PREFIX):
                self._control(h, method, key[len(CONTROL_PREFIX) :])
                return
            self._counters.request(key, method)
            if method not in ("GET", "HEAD"):
                self._status(h, 405, key)
                return
            fault = self._pick_fault(key) if method == "GET" else None
            if not self._wait_first_byte(h, key, method):
                h.close_connection = True
                return
            if method == "GET" and fault is None and self.link.throttled():
                self._counters.throttle(key)
                self._status(h, 503, key, body=SLOWDOWN_BODY)
                return
            if fault is not None and fault.kind not in BODY_FAULTS:
                self._counters.fault(key)
                extra = {"Retry-After": str(fault.retry_after_s)} if fault.kind == "retry-after" else None
                self._status(h, STATUS_FAULTS.get(fault.kind, 503), key, extra)
                return
            self._serve_file(h, key, method, fault)
        except ClientGone:
            h.close_connection = True

    def _wait_first_byte(self, h: Handler, key: str, method: str) -> bool:
        """Hold the response back as the link says; False when the client (or the emulator) went first."""
        if method == "GET" and self.link.held(key):
            self._counters.hold(key)
            wait_or_gone(h.connection, math.inf, self._closing)
            self._counters.abandon(key)
            return False
        delay, straggler = self.link.first_byte_delay()
        if straggler:
            self._counters.straggle(key)
        if delay <= 0:
            return True
        if wait_or_gone(h.connection, delay, self._closing):
            return True
        self._counters.abandon(key)
        return False

    def _status(
        self, h: Handler, status: int, key: str, extra: dict[str, str] | None = None, body: bytes | None = None
    ) -> None:
        if body is None:
            body = f"{status} {http.HTTPStatus(status).phrase}: {key}\n".encode()
        content_type = "application/xml" if body.startswith(b"<?xml") else "text/plain"
        self._send_headers(h, status, {"Content-Type": content_type, "Content-Length": str(len(body)), **(extra or {})})
        if h.command != "HEAD":
            self._write(h, key, body, None)

    def _serve_file(self, h: Handler, key: str, method: str, fault: Fault | None) -> None:
        target = (self.root / key).resolve()
        if self.root not in target.parents or not target.is_file():
            self._counters.missing()
            self._status(h, 404, key)
            return
        stat = target.stat()
        size = stat.st_size
        start, stop, status = 0, size, 200
        byte_range = h.headers.get("Range")
        if byte_range is not None:
            match = _RANGE.match(byte_range.strip())
            if match is None or match.groups() == ("", ""):
                self._status(h, 400, key)
                return
            first, last = match.groups()
            if first == "":  # suffix range: the last N bytes
                start = max(size - int(last), 0)
            else:
                start = int(first)
                stop = min(int(last) + 1, size) if last else size
            if start >= size or start >= stop:
                self._status(h, 416, key, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(stop - start),
            "Accept-Ranges": "bytes",
            "Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True),
            "ETag": f'"{stat.st_mtime_ns:x}-{size:x}"',
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        if method == "HEAD":
            self._send_headers(h, status, headers)
            return
        with open(target, "rb") as f:
            f.seek(start)
            body = f.read(stop - start)
        self._send_headers(h, status, headers)
        if fault is None:
            self._write(h, key, body, self.link.bandwidth_bytes_per_s)
            return
        self._counters.fault(key)
        self._write(h, key, body[: len(body) // 2], self.link.bandwidth_bytes_per_s)
        h.close_connection = True
        if fault.kind == "reset":
            # linger 0: close() sends RST instead of FIN
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
        elif fault.kind == "stall":
            self._closing.wait(fault.stall_s)
        # "truncate": return with close_connection set; the server closes cleanly

    def _send_headers(self, h: Handler, status: int, headers: Mapping[str, str]) -> None:
        try:
            h.send_response(status)
            for name, value in headers.items():
                h.send_header(name, value)
            h.end_headers()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ClientGone from exc

    def _write(self, h: Handler, key: str, body: bytes, bandwidth: float | None) -> None:
        # bytes are counted as they go out, before the write returns: a client may have read them (and its
        # test read the counters) before this thread runs again; a write that fails takes its count back
        view = memoryview(body)
        piece = view
        try:
            if bandwidth is None:
                self._counters.sent(key, len(view))
                h.wfile.write(view)
                return
            t0 = time.monotonic()
            sent = 0
            for off in range(0, len(view), PACE_SLICE_BYTES):
                piece = view[off : off + PACE_SLICE_BYTES]
                self._counters.sent(key, len(piece))
                h.wfile.write(piece)
                sent += len(piece)
                delay = t0 + sent / bandwidth - time.monotonic()
                if delay > 0 and self._closing.wait(delay):
                    raise ClientGone
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            self._counters.sent(key, -len(piece))
            raise ClientGone from exc

    def _control(self, h: Handler, method: str, action: str) -> None:
        if method == "GET" and action == "stats":
            self._reply_json(h, self.stats().to_dict())
        elif method == "POST" and action == "reset":
            self.reset_stats()
            self._reply_json(h, {"ok": True})
        elif method == "POST" and action == "config":
            length = int(h.headers.get("Content-Length") or 0)
            settings = json.loads(h.rfile.read(length) or b"{}")
            try:
                self.configure(**settings)
            except (TypeError, ValueError) as exc:
                self._reply_json(h, {"error": str(exc)}, status=400)
                return
            self._reply_json(h, self.link.settings())
        else:
            self._reply_json(h, {"error": f"unknown control request {method} {action!r}"}, status=404)

    def _reply_json(self, h: Handler, payload: Any, status: int = 200) -> None:
        body = json.dumps(payload).encode()
        self._send_headers(h, status, {"Content-Type": "application/json", "Content-Length": str(len(body))})
        h.wfile.write(body)
