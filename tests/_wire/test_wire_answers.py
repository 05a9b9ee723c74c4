"""Answers a server may give, through each client: the engine's gives obstore's bytes, or a clear error where it errs.

Each case runs a scripted emulator and reads one key as a pass
reads it (``read_through``: ``client_for`` + ``Fetcher``, the store built
with ``obstore_store(url, client=name)``). Where obstore returns wrong
bytes (a 206 shorter than its own Content-Range) the engine refuses them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from scripted import WIRE_CLIENTS, read_through
from zarr.abc.store import RangeByteRequest, SuffixByteRequest

from insitubatch._engine.stats import PassCounters
from insitubatch._wire.engine_client import USER_AGENT
from insitubatch.stores.read_policy import Outcome, changed, classify
from insitubatch.testing.emulator import Reply, Request, answer, ranged

BODY = bytes(range(256)) * 64  # 16 KiB
KEY = "d/k.0"


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


def _no_fatal_protocol_errors(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio logged no "Fatal error: protocol.buffer_updated() call failed" (a fault inside a callback)."""
    assert not [r for r in caplog.records if r.name == "asyncio" and "Fatal error" in r.getMessage()]


WRONG_206 = {
    "another-range": lambda r: answer(206, BODY[8:12], Content_Range=f"bytes 8-11/{len(BODY)}"),
    "shorter-range": lambda r: answer(206, BODY[0:2], Content_Range=f"bytes 0-1/{len(BODY)}"),
    "no-content-range": lambda r: answer(206, BODY[0:4]),
    # the range asked, but fewer body bytes than it names
    "short-body": lambda r: answer(206, BODY[0:2], Content_Range=f"bytes 0-3/{len(BODY)}"),
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("quirk", sorted(WRONG_206))
def test_a_206_that_is_not_the_range_asked_is_never_returned(scripted, client: str, quirk: str, caplog) -> None:
    server = scripted(WRONG_206[quirk])
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 4))
    if client == "obstore" and quirk == "short-body":
        assert got == BODY[:2]  # obstore returns what came; the engine (below) refuses it
        return
    assert isinstance(got, OSError), got
    assert len(server.requests) == 2  # a fault, retried once: the same fault again is the server's way, not retried
    if client == "engine":
        text = str(got)
        assert f"'{KEY}'" in text and "asked bytes=0-3" in text and "RangeMismatchError" in text
        assert {"another-range": "8-11", "shorter-range": "0-1", "no-content-range": "no Content-Range"}.get(
            quirk, "2 body bytes"
        ) in text
    _no_fatal_protocol_errors(caplog)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_wrong_range_once_is_retried_and_the_right_bytes_come_back(scripted, client: str) -> None:
    def answers(request: Request) -> bytes:
        return WRONG_206["another-range"](request) if len(server.requests) == 1 else ranged(BODY, "bytes=0-3")

    server = scripted(answers)
    assert read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 4)) == BODY[:4]
    assert len(server.requests) == 2


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_versioned_read_names_the_etag_and_its_412_is_not_retried(scripted, client: str) -> None:
    """A shard's index read asks for its ETag; an inner chunk's read If-Match it gets the store's 412 at once."""

    def answers(request: Request) -> bytes:
        asked = request.headers.get("if-match")
        if asked is not None and asked != '"v2"':
            return answer(412, b"", Last_Modified="Mon, 01 Jan 2024 00:00:00 GMT")
        return ranged(BODY, request.headers.get("range"), Last_Modified="Mon, 01 Jan 2024 00:00:00 GMT", ETag='"v2"')

    server = scripted(answers)
    url, span = server.url_for("ds"), RangeByteRequest(0, 100)
    assert read_through(client, url, KEY, span, version="") == (BODY[:100], '"v2"')
    counters = PassCounters()
    stale = read_through(client, url, KEY, span, version='"v1"', counters=counters)
    assert isinstance(stale, Exception) and changed(stale) and classify(stale) is Outcome.FATAL, stale
    assert counters.retries == 0 and counters.throttled == 0 and counters.stalls == 0
    assert read_through(client, url, KEY, span, version='"v2"') == (BODY[:100], '"v2"')
    assert read_through(client, url, KEY, span) == BODY[:100]
    assert [r.headers.get("if-match") for r in server.requests] == [None, '"v1"', '"v2"', None]


# 200s to a ranged GET that are not provably the whole object: each refused at once, naming the key, by both clients
NOT_WHOLE_200 = {
    "ignores-range": lambda r: answer(200, BODY),  # python -m http.server
    "gateway-error-page": lambda r: answer(200, b"<html><body>Bad gateway, try later</body></html>" * 40),
    "206-relabelled-200": lambda r: answer(200, BODY[100:300], Content_Range=f"bytes 100-299/{len(BODY)}"),
    "content-range-not-whole": lambda r: answer(200, BODY, Content_Range=f"bytes 0-{len(BODY) - 1}/{len(BODY) + 1}"),
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("quirk", sorted(NOT_WHOLE_200))
def test_a_200_to_a_range_that_is_not_provably_the_whole_object_is_refused(scripted, client: str, quirk) -> None:
    server = scripted(NOT_WHOLE_200[quirk])
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(100, 300))
    assert isinstance(got, Exception) and "Range request not supported" in str(got), got
    assert classify(got) is Outcome.FATAL and KEY in str(got)
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_200_whose_content_range_names_the_whole_object_is_cut_by_the_engine(scripted, client: str) -> None:
    whole = f"bytes 0-{len(BODY) - 1}/{len(BODY)}"
    server = scripted(lambda r: answer(200, BODY, Content_Range=whole))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(100, 300))
    if client == "obstore":
        assert isinstance(got, Exception) and "Range request not supported" in str(got)  # obstore refuses any 200
    else:
        assert got == BODY[100:300]  # provably the whole object: the range is in it


# A large object a Range-ignoring server sends whole: far more than any socket buffer holds on loopback.
HUGE = 256 << 20
PIECE = bytes(range(256)) * 256  # 64 KiB


def _whole_object(proof: bool = False):
    """Every request answered with the whole object (its Content-Range saying so with ``proof``), piece by piece."""
    whole = b"Content-Range: bytes 0-%d/%d\r\n" % (HUGE - 1, HUGE) if proof else b""

    def pieces() -> Iterator[bytes]:
        yield b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n" % (whole, HUGE)
        for _ in range(HUGE // len(PIECE)):  # (a client that stops reading and closes ends it: what went out counts)
            yield PIECE

    return lambda r: Reply(pieces())


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("where", ["head", "tail", "head-proven-whole"])
def test_a_large_object_served_whole_for_a_range_is_not_downloaded(scripted, client: str, where: str) -> None:
    server = scripted(_whole_object(proof=where == "head-proven-whole"))
    byte_range = SuffixByteRequest(16) if where == "tail" else RangeByteRequest(0, 16)  # a shard index
    t0 = time.perf_counter()
    got = read_through(client, server.url_for("ds"), KEY, byte_range)
    if client == "engine" and where == "head-proven-whole":
        assert got == PIECE[:16]  # stopped after the bytes it needs
    else:
        assert isinstance(got, Exception) and classify(got) is Outcome.FATAL, (
            got
        )  # one attempt: the server ignores ranges
        assert "Range" in str(got)
    if client == "engine":
        assert len(server.connections) == 1  # (obstore's suffix read falls back to a HEAD and a ranged GET)
    deadline = time.monotonic() + 10
    while server.open_connections and time.monotonic() < deadline:  # each ends as its client stops reading
        time.sleep(0.01)
    sent = [c.bytes_sent for c in server.connections if c.closed_s is not None]
    assert sent and max(sent) < HUGE // 4  # the rest never crossed the wire
    assert time.perf_counter() - t0 < 10


# A chunked body's pace on a real link: many reads, each a few chunks (a parser that rescans from the start on
# every read is quadratic in them: 2.2 s of loop CPU for this body, against 0.1 s).
CHUNKS_PER_SEND = 16
SEND_PAUSE_S = 0.0005


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_large_chunked_body_takes_time_linear_in_its_size(scripted, client: str) -> None:
    body = PIECE * 512  # 32 MiB, in 4 KiB chunks
    chunk = 4 << 10

    def pieces() -> Iterator[bytes | float]:
        yield (
            f"HTTP/1.1 206 X\r\nContent-Range: bytes 0-{len(body) - 1}/{len(body)}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        for i in range(0, len(body), chunk * CHUNKS_PER_SEND):
            group = body[i : i + chunk * CHUNKS_PER_SEND]
            yield b"".join(b"%x\r\n%s\r\n" % (chunk, group[j : j + chunk]) for j in range(0, len(group), chunk))
            yield SEND_PAUSE_S
        yield b"0\r\n\r\n"

    server = scripted(lambda r: Reply(pieces()))
    cpu = time.thread_time()
    got = read_through(client, server.url_for("ds"), KEY)  # a whole key: no size known, so no streaming through obstore
    cpu = time.thread_time() - cpu
    if client == "obstore":
        assert isinstance(got, OSError)  # obstore wants a Content-Length on a 206
        return
    assert got == body
    assert cpu < 1.0


BROKEN = {
    "chunk-size": lambda r: b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-3/9\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "content-length": lambda r: b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nabc",
    "status-line": lambda r: b"HTTP/1.1 two hundred\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("quirk", sorted(BROKEN))
def test_malformed_framing_is_one_clear_error(scripted, client: str, quirk: str, caplog) -> None:
    server = scripted(BROKEN[quirk])
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 4))
    assert isinstance(got, OSError), got
    if client == "engine":
        assert "FramingError" in str(got) and server.url_for("").rstrip("/") in str(got)
        assert "closed the connection" not in str(got)  # (what the old parser's crash looked like)
    _no_fatal_protocol_errors(caplog)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_url_token_goes_with_every_request(scripted, client: str) -> None:
    token = "sv=2024-01-01&sig=a%2Fb%3D&se=2099"

    def answers(request: Request) -> bytes:
        if request.query != token:
            return answer(403, b"<Error><Code>AuthenticationFailed</Code></Error>")
        return ranged(BODY, request.headers.get("range"))

    server = scripted(answers)
    url = server.url_for(f"ds.zarr?{token}")
    assert read_through(client, url, KEY, RangeByteRequest(5, 50)) == BODY[5:50]
    assert read_through(client, url, KEY) == BODY
    assert {r.path for r in server.requests} == {f"/ds.zarr/{KEY}"}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_requests_name_their_client(scripted, client: str) -> None:
    server = scripted(lambda r: ranged(BODY, r.headers.get("range")))
    assert read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 4)) == BODY[:4]
    agent = server.requests[-1].headers["user-agent"]
    assert agent == USER_AGENT if client == "engine" else agent.startswith("object_store/")
    assert USER_AGENT.startswith("insitubatch/") and USER_AGENT != "insitubatch/"
    options = {"user_agent": "my-trainer/1.0"}
    assert read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 4), client_options=options) == BODY[:4]
    assert server.requests[-1].headers["user-agent"] == "my-trainer/1.0"


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_statuses_mean_the_same_through_both_clients(scripted, client: str) -> None:
    def answers(request: Request) -> bytes:
        name = request.path.rsplit("/", 1)[-1]
        if name == "missing":
            return answer(404)
        if name == "denied":
            return answer(403, b"<Error><Code>AccessDenied</Code></Error>")
        if name == "slow" and sum(r.path.endswith("slow") for r in server.requests) == 1:
            return answer(503, b"<Error><Code>SlowDown</Code></Error>")
        return ranged(BODY, request.headers.get("range"))

    server = scripted(answers)
    url = server.url_for("ds")
    assert read_through(client, url, "missing") is None
    denied = read_through(client, url, "denied")
    assert isinstance(denied, PermissionError) or "PermissionDenied" in type(denied).__name__, denied
    assert read_through(client, url, "slow", RangeByteRequest(1, 9)) == BODY[1:9]
    assert [r.path.rsplit("/", 1)[-1] for r in server.requests] == ["missing", "denied", "slow", "slow"]
