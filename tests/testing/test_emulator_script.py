"""The emulator's scripted mode: a script's answer goes out byte for byte, then the connection does what it says."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path

import pytest

from insitubatch.testing.emulator import CLOSE, Emulator, Reply, Request, answer, ranged

BODY = bytes(range(256)) * 8
# Every client wait here is bounded by this (a loaded 2-core machine), never waited out.
CLIENT_TIMEOUT_S = 10.0
# How long a held connection is watched for a byte that must not come.
SILENCE_S = 0.3


def _exchange(emu: Emulator, *heads: bytes) -> bytes:
    """Send ``heads`` on one raw connection (each after the previous answer began) and read until it closes."""
    with socket.create_connection(("127.0.0.1", emu.port), timeout=CLIENT_TIMEOUT_S) as conn:
        got = b""
        for head in heads:
            conn.sendall(head)
            got += conn.recv(65536)
        while piece := conn.recv(65536):
            got += piece
    return got


def _get(path: str, **headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_bytes_go_out_as_written_and_each_request_knows_its_connection(tmp_path: Path) -> None:
    bare_lf = b"HTTP/1.1 200 OK\nContent-Length: 3\n\nabc"

    def script(request: Request) -> Reply | bytes:
        if request.nth == 0:
            return bare_lf
        return Reply((b"HTTP/1.0 200 OK\r\n\r\n", 0.01, b"to the close"), "close")

    with Emulator(None, latency_s=0.0, jitter_s=0.0, script=script, record=True) as emu:
        got = _exchange(emu, _get("/a?x=1", Range="bytes=0-2"), _get("/b"))
        assert got == bare_lf + b"HTTP/1.0 200 OK\r\n\r\nto the close"
        first, second = emu.requests
        assert (first.method, first.path, first.query, first.headers["range"]) == ("GET", "/a", "x=1", "bytes=0-2")
        assert (first.connection, first.nth, second.connection, second.nth) == (1, 0, 1, 1)
        assert first.head.startswith(b"GET /a?x=1 HTTP/1.1\r\n") and first.head.endswith(b"Range: bytes=0-2\r\n\r\n")
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while emu.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        (record,) = emu.connections
        assert record.requests == 2 and record.bytes_sent == len(got)
        assert record.answered_s is not None and record.closed_s is not None and record.closed_s >= record.answered_s


def test_none_lets_the_emulator_serve_the_file_and_close_answers_nothing(tmp_path: Path) -> None:
    (tmp_path / "k").write_bytes(BODY)
    script = {"/gone": CLOSE, "/odd": answer(418, b"no")}.get
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0, script=lambda r: script(r.path)) as emu:
        conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=CLIENT_TIMEOUT_S)
        conn.request("GET", "/k", headers={"Range": "bytes=3-9"})
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (206, BODY[3:10])  # the emulator's own answer
        conn.request("GET", "/odd")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (418, b"no")
        conn.close()
        assert _exchange(emu, _get("/gone")) == b""
        assert emu.stats().gets == 3 and emu.requests == []  # counted, but no log without record=True
    with Emulator(None, latency_s=0.0, jitter_s=0.0, script=lambda r: None) as emu:
        assert _exchange(emu, _get("/k", Connection="close")).startswith(b"HTTP/1.1 404")  # no root: nothing to serve


def test_a_reset_and_a_hold_end_the_connection_as_a_dead_server_would() -> None:
    def script(request: Request) -> Reply:
        if request.path == "/reset":
            return Reply((answer(200, BODY)[:100],), "reset")
        return Reply((answer(200, BODY)[:100],), "hold")

    with Emulator(None, latency_s=0.0, jitter_s=0.0, script=script, record=True) as emu:
        with pytest.raises(ConnectionResetError):
            _exchange(emu, _get("/reset"))
        with socket.create_connection(("127.0.0.1", emu.port), timeout=CLIENT_TIMEOUT_S) as conn:
            conn.sendall(_get("/hold"))
            assert conn.recv(65536) == answer(200, BODY)[:100]
            conn.settimeout(SILENCE_S)
            with pytest.raises(TimeoutError):  # the rest never comes
                conn.recv(65536)
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while emu.open_connections and time.monotonic() < deadline:  # the held one ends as its client goes
            time.sleep(0.01)
        assert emu.open_connections == 0


def test_ranged_answers_a_range_as_a_server_does_and_a_reply_checks_what_follows() -> None:
    assert ranged(BODY, None) == answer(200, BODY)
    assert ranged(BODY, "bytes=10-19").endswith(b"\r\n\r\n" + BODY[10:20])
    assert b"Content-Range: bytes 2038-2047/2048" in ranged(BODY, "bytes=-10")
    assert ranged(BODY, f"bytes={len(BODY)}-").startswith(b"HTTP/1.1 416")
    with pytest.raises(ValueError, match="after='linger'"):
        Reply((), "linger")
