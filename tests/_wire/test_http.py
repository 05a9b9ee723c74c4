"""The engine's own HTTP client: bytes equal the files, framing a real server may use, errors sorted, no socket left open."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from pathlib import Path

import obstore.store
import pytest
from helpers import sockets_to
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.store_link import client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch._wire.backends import ObstoreBackend
from insitubatch._wire.connection import Ask, Connection
from insitubatch._wire.engine_client import NativeBackend
from insitubatch._wire.faults import HttpStatusError
from insitubatch._wire.pool import HttpPool
from insitubatch._wire.sigv4 import SigV4
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.stores.read_policy import Outcome, classify
from insitubatch.testing.emulator import CLOSE, Emulator, Reply, Request

BUCKET = "bkt"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / BUCKET / "d"
    base.mkdir(parents=True)
    for i in range(40):
        (base / f"k{i}").write_bytes(os.urandom(1000 + 997 * i))
    (base / "empty").write_bytes(b"")
    return tmp_path


def test_an_http_store_is_read_by_the_engine_client_byte_for_byte(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for(BUCKET), read_only=True)
        client = client_for(store)
        assert isinstance(client.backend, NativeBackend)
        fetcher = Fetcher(client, ReadWindow(16).user(16), PassCounters())
        data = (root / BUCKET / "d" / "k7").read_bytes()

        async def main() -> list:
            return await asyncio.gather(
                fetcher.get("d/k7"),
                fetcher.get("d/k7", RangeByteRequest(10, 500)),
                fetcher.get("d/k7", OffsetByteRequest(1234)),
                fetcher.get("d/k7", SuffixByteRequest(77)),
                fetcher.get("d/empty"),
                fetcher.get("d/nothing-here"),
                *(fetcher.get(f"d/k{i}") for i in range(40)),
            )

        whole, ranged, offset, suffix, empty, missing, *every = asyncio.run(main())
        assert whole.to_bytes() == data
        assert ranged.to_bytes() == data[10:500]
        assert offset.to_bytes() == data[1234:]
        assert suffix.to_bytes() == data[-77:]
        assert empty.to_bytes() == b""
        assert missing is None
        assert [b.to_bytes() for b in every] == [(root / BUCKET / "d" / f"k{i}").read_bytes() for i in range(40)]
        # 46 reads + the empty object's plain GET after its ranged one was refused (416)
        assert emu.stats().gets == 47 and fetcher.counters.retries == 0
        close_store(store)


def test_connections_are_kept_alive_and_closed_with_their_loop_and_their_store(root: Path) -> None:
    with Emulator(root, latency_s=0.005, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for(BUCKET), read_only=True)
        backend = client_for(store).backend
        assert isinstance(backend, NativeBackend)
        opened: list[int] = []

        async def rounds(backend: NativeBackend) -> None:
            for _ in range(5):  # 5 rounds of 8 at once: 8 connections, reused
                await asyncio.gather(*(backend.request(f"d/k{i}") for i in range(8)))
            opened.append(sockets_to(emu.port))

        asyncio.run(rounds(backend))
        assert opened == [8]
        assert sockets_to(emu.port) == 0  # asyncio.run ended the loop: its connections closed with it

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(rounds(backend), loop).result(30)
            assert opened[-1] == 8
            close_store(store)
            del store, backend
            gc.collect()  # the store is gone: its client closes the idle connections on their loop
            for _ in range(100):
                if sockets_to(emu.port) == 0:
                    break
                threading.Event().wait(0.02)
            assert sockets_to(emu.port) == 0
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def _ask(target: str, want: tuple[int, int] | None = None) -> Ask:
    return Ask(None, target, None, target, None if want is None else f"{want[0]}-{want[1] - 1}", want)


def _get(server: Emulator, *requests: tuple[str, tuple[int, int] | None]) -> list:
    pool = HttpPool("http", "127.0.0.1", server.port)

    async def main() -> list:
        out = []
        for target, want in requests:
            head = f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            try:
                out.append(bytes(await asyncio.wait_for(pool.get(head, _ask(target, want)), 10)))
            except Exception as exc:
                out.append(exc)
        return out

    return asyncio.run(main())


BODY = bytes(range(256)) * 40


def test_chunked_unframed_interim_and_ignored_range_answers_are_read_whole(scripted) -> None:
    def chunked_parts() -> list[bytes]:  # in pieces, with a trailer
        parts = [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
        for i in range(0, len(BODY), 3000):
            piece = BODY[i : i + 3000]
            parts.append(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
        return [*parts, b"0\r\nX-Trailer: y\r\n\r\n"]

    def script(request: Request) -> Reply:
        assert request.connection == 1, request  # one connection carries all three
        if request.nth == 0:
            return Reply(chunked_parts())
        if request.nth == 1:  # a 200 with the whole object (its Content-Range says so), for a range: the range cut out
            whole = b"Content-Range: bytes 0-%d/%d\r\n" % (len(BODY) - 1, len(BODY))
            return Reply((b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n" % (whole, len(BODY)) + BODY,))
        return Reply((b"HTTP/1.0 200 OK\r\n\r\n" + BODY,), "close")  # no length: the body runs to the close

    server = scripted(script)
    chunked, cut, unframed = _get(server, ("/a", None), ("/b", (100, 300)), ("/c", None))
    assert chunked == BODY and cut == BODY[100:300] and unframed == BODY
    assert len(server.connections) == 1


def test_an_idle_close_is_retried_once_on_a_fresh_connection(scripted) -> None:
    def script(request: Request) -> Reply:
        if request.connection == 1 and request.nth == 1:
            return CLOSE  # the server closes a kept-alive connection as the next GET arrives
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
        return Reply((ok,), "keep" if request.connection == 1 else "close")

    server = scripted(script)
    assert _get(server, ("/a", None), ("/b", None)) == [BODY, BODY]
    assert len(server.connections) == 2


def test_a_body_cut_short_is_a_transient_error_and_statuses_are_sorted(scripted) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + BODY[:100],
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 60\r\n\r\n"
        + b"<Error><Code>SlowDown</Code></Error>".ljust(60),
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops",
    ]

    server = scripted(lambda r: Reply((answers[r.connection - 1],), "close"))
    cut, slow, denied, missing, failed = _get(server, *((f"/k{i}", None) for i in range(5)))
    assert isinstance(cut, ConnectionResetError) and classify(cut) is Outcome.RETRY
    assert isinstance(slow, HttpStatusError) and slow.status == 503 and classify(slow) is Outcome.THROTTLE
    assert "SlowDown" in str(slow)
    assert isinstance(denied, PermissionError) and classify(denied) is Outcome.FATAL
    assert isinstance(missing, FileNotFoundError) and classify(missing) is Outcome.MISSING
    assert isinstance(failed, HttpStatusError) and classify(failed) is Outcome.RETRY and "oops" in str(failed)


def test_a_cancelled_get_closes_its_connection(scripted) -> None:
    server = scripted(lambda r: Reply(after="hold"))  # never answers while the client waits
    pool = HttpPool("http", "127.0.0.1", server.port)

    async def main() -> None:
        future = pool.get(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n", _ask("/x"))
        await asyncio.sleep(0.2)
        assert sockets_to(server.port) == 1
        future.cancel()
        await asyncio.sleep(0.1)
        assert sockets_to(server.port) == 0

    asyncio.run(main())


def test_large_reads_still_stream_through_obstore(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for(BUCKET), read_only=True)
        backend = client_for(store).backend
        assert isinstance(backend, NativeBackend) and isinstance(backend.obstore, ObstoreBackend)
        assert backend.obstore.raw is backend.raw  # the hand-overs go to obstore's client on the same twin
        assert isinstance(backend.raw, obstore.store.HTTPStore)  # what fetch's large reads stream from
        close_store(store)


def test_sigv4_headers_match_botocore() -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    for token in (None, "SESSION/TOKEN+="):
        signer = SigV4("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "eu-central-1", token)
        for host, path in (("127.0.0.1:9000", "/bkt/d/k%20x/c.0.1"), ("bkt.s3.eu-central-1.amazonaws.com", "/a~b")):
            lines = signer.headers(host, path, now=1_796_000_000.0)
            sent = dict(line.split(": ", 1) for line in lines.strip().split("\r\n"))
            headers = {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD", "X-Amz-Date": sent["x-amz-date"]}
            if token:
                headers["X-Amz-Security-Token"] = token
            request = AWSRequest(method="GET", url=f"http://{host}{path}", headers=headers)
            request.context["timestamp"] = sent["x-amz-date"]
            auth = S3SigV4Auth(Credentials("AKIDEXAMPLE", signer._secret, token), "s3", "eu-central-1")
            canonical = auth.canonical_request(request)
            signature = auth.signature(auth.string_to_sign(request, canonical), request)
            signed = auth.signed_headers(auth.headers_to_sign(request))
            assert sent["Authorization"] == (
                f"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{sent['x-amz-date'][:8]}/eu-central-1/s3/aws4_request, "
                f"SignedHeaders={signed}, Signature={signature}"
            )
            assert sent.get("x-amz-security-token") == token


def test_a_host_name_is_looked_up_once_for_many_new_connections(scripted, monkeypatch) -> None:
    server = scripted(lambda r: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
    lookups: list[str] = []
    getaddrinfo = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def counted(self, host, *args, **kwargs):
        lookups.append(host)
        return await getaddrinfo(self, host, *args, **kwargs)

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", counted)
    pool = HttpPool("http", "localhost", server.port)

    async def main() -> list:
        head = b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n"
        return await asyncio.gather(*(pool.get(head, _ask("/x")) for _ in range(8)))

    answers = asyncio.run(main())
    assert [bytes(a) for a in answers] == [BODY] * 8
    assert len(server.connections) == 8 and lookups == ["localhost"]


def _paced_reads(tmp_path: Path, sizes: list[int], monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], int]:
    """Read objects of ``sizes`` over a paced link (64 KiB slices at 10 MB/s); whether each equals its file, and
    how many times the connections took in bytes."""
    base = tmp_path / BUCKET / "d"
    base.mkdir(parents=True)
    files = {f"d/p{i}": os.urandom(n) for i, n in enumerate(sizes)}
    for key, data in files.items():
        (tmp_path / BUCKET / key).write_bytes(data)
    wakeups = 0
    taken_in = Connection.buffer_updated

    def counted(self: Connection, nbytes: int) -> None:
        nonlocal wakeups
        wakeups += 1
        taken_in(self, nbytes)

    monkeypatch.setattr(Connection, "buffer_updated", counted)
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0, bandwidth_bytes_per_s=10e6) as emu:
        store = obstore_store(emu.url_for(BUCKET), read_only=True)
        fetcher = Fetcher(client_for(store), ReadWindow(4).user(4), PassCounters())

        async def main() -> list:
            return await asyncio.gather(*(fetcher.get(key) for key in files))

        got = asyncio.run(main())
        store.close()
    assert fetcher.counters.stalls == fetcher.counters.retries == 0  # no read waited for bytes that had come
    return [g.to_bytes() == data for g, data in zip(got, files.values())], wakeups


def test_a_paced_body_is_taken_in_once_it_has_arrived_not_slice_by_slice(tmp_path: Path, monkeypatch) -> None:
    same, wakeups = _paced_reads(tmp_path / "a", [640_000] * 4, monkeypatch)
    assert all(same)
    assert wakeups <= 4 * 3  # each: the head (with what came with it), the rest, at most one more
    # the same reads without the low-water mark take each of the ~10 slices in as it comes
    monkeypatch.setattr("insitubatch._wire.connection.LOWAT_FROM_BYTES", 1 << 40)
    same, slice_by_slice = _paced_reads(tmp_path / "b", [640_000] * 4, monkeypatch)
    assert all(same) and slice_by_slice >= 4 * 8


def test_a_body_larger_than_the_low_water_cap_is_read_whole_as_the_mark_follows_its_rest(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("insitubatch._wire.connection.LOWAT_MAX_BYTES", 256 << 10)
    # 3.1 x the cap, and a rest that ends below LOWAT_FROM_BYTES: neither may leave the read waiting
    same, _ = _paced_reads(tmp_path, [int(3.1 * (256 << 10)), (256 << 10) + 1000], monkeypatch)
    assert same == [True, True]
