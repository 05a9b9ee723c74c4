"""The engine's own HTTP client: bytes equal the files, framing a real server may use, errors sorted, no socket left open."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import obstore.store
import pytest
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.read_policy import Outcome, classify
from insitubatch._engine.reads.store_link import client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch._wire.backends import _ObstoreBackend
from insitubatch._wire.engine_client import NativeBackend, native_backend
from insitubatch._wire.http import HttpPool, HttpStatusError
from insitubatch._wire.sigv4 import SigV4
from insitubatch.io.owned import close_store
from insitubatch.io.stores import obstore_store
from insitubatch.testing.emulator import Emulator

BUCKET = "bkt"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / BUCKET / "d"
    base.mkdir(parents=True)
    for i in range(40):
        (base / f"k{i}").write_bytes(os.urandom(1000 + 997 * i))
    (base / "empty").write_bytes(b"")
    return tmp_path


def _sockets_to(port: int) -> int:
    """This process's TCP connections to ``port`` on loopback (from /proc, not from the client's own books)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile (the listing's own descriptor, too)
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if inode in inodes and int(remote.split(":")[1], 16) == port and state == "01":  # ESTABLISHED
            count += 1
    return count


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
            opened.append(_sockets_to(emu.port))

        asyncio.run(rounds(backend))
        assert opened == [8]
        assert _sockets_to(emu.port) == 0  # asyncio.run ended the loop: its connections closed with it

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
                if _sockets_to(emu.port) == 0:
                    break
                threading.Event().wait(0.02)
            assert _sockets_to(emu.port) == 0
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


class _Scripted(socketserver.ThreadingTCPServer):
    """A loopback server whose every connection runs ``script(conn)``: raw bytes, any framing."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        self.script = script
        self.connections = 0
        self.lock = threading.Lock()

        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with outer.lock:
                    outer.connections += 1
                    n = outer.connections
                outer.script(self.request, n)

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def scripted() -> Iterator[Callable[[Callable[[socket.socket, int], None]], _Scripted]]:
    servers: list[_Scripted] = []

    def start(script: Callable[[socket.socket, int], None]) -> _Scripted:
        server = _Scripted(script)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(4096)
        if not piece:
            return b""
        data += piece
    return data


def _get(server: _Scripted, *requests: tuple[str, tuple[int, int] | None]) -> list:
    pool = HttpPool("http", "127.0.0.1", server.server_address[1])

    async def main() -> list:
        out = []
        for target, trim in requests:
            head = f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            try:
                out.append(bytes(await asyncio.wait_for(pool.get(head, target, trim), 10)))
            except Exception as exc:
                out.append(exc)
        return out

    return asyncio.run(main())


BODY = bytes(range(256)) * 40


def test_chunked_unframed_interim_and_ignored_range_answers_are_read_whole(scripted) -> None:
    def script(conn: socket.socket, n: int) -> None:
        _read_request(conn)  # chunked, in pieces, with a trailer
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(BODY), 3000):
            piece = BODY[i : i + 3000]
            conn.sendall(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
        conn.sendall(b"0\r\nX-Trailer: y\r\n\r\n")
        _read_request(conn)  # a 200 with the whole object, for a range: the client cuts the range out
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
        _read_request(conn)  # no length: the body runs to the close
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + BODY)
        conn.close()

    server = scripted(script)
    chunked, cut, unframed = _get(server, ("/a", None), ("/b", (100, 300)), ("/c", None))
    assert chunked == BODY and cut == BODY[100:300] and unframed == BODY
    assert server.connections == 1


def test_an_idle_close_is_retried_once_on_a_fresh_connection(scripted) -> None:
    def script(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
        if n == 1:
            _read_request(conn)  # the server closes a kept-alive connection as the next GET arrives
            conn.close()
            return
        conn.close()

    server = scripted(script)
    assert _get(server, ("/a", None), ("/b", None)) == [BODY, BODY]
    assert server.connections == 2


def test_a_body_cut_short_is_a_transient_error_and_statuses_are_sorted(scripted) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + BODY[:100],
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 60\r\n\r\n"
        + b"<Error><Code>SlowDown</Code></Error>".ljust(60),
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops",
    ]

    def script(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        conn.sendall(answers[n - 1])
        conn.close()

    server = scripted(script)
    cut, slow, denied, missing, failed = _get(server, *((f"/k{i}", None) for i in range(5)))
    assert isinstance(cut, ConnectionResetError) and classify(cut) is Outcome.RETRY
    assert isinstance(slow, HttpStatusError) and slow.status == 503 and classify(slow) is Outcome.THROTTLE
    assert "SlowDown" in str(slow)
    assert isinstance(denied, PermissionError) and classify(denied) is Outcome.FATAL
    assert isinstance(missing, FileNotFoundError) and classify(missing) is Outcome.MISSING
    assert isinstance(failed, HttpStatusError) and classify(failed) is Outcome.RETRY and "oops" in str(failed)


def test_a_cancelled_get_closes_its_connection(scripted) -> None:
    held = threading.Event()

    def script(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        held.wait(10)  # never answers while the client waits
        conn.close()

    server = scripted(script)
    pool = HttpPool("http", "127.0.0.1", server.server_address[1])

    async def main() -> None:
        future = pool.get(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n", "/x", None)
        await asyncio.sleep(0.2)
        assert _sockets_to(server.server_address[1]) == 1
        future.cancel()
        await asyncio.sleep(0.1)
        assert _sockets_to(server.server_address[1]) == 0

    asyncio.run(main())
    held.set()


def _no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


def test_which_stores_the_engine_reads_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_environment(monkeypatch)

    def backend(raw):
        return native_backend(raw, raw)

    http = obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x", client_options={"allow_http": True})
    assert isinstance(backend(http), NativeBackend)
    assert backend(obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x")) is None  # obstore refuses http
    headers = {"allow_http": True, "default_headers": {"x-a": "b"}}
    assert backend(obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x", client_options=headers)) is None
    anonymous = {"endpoint": "http://127.0.0.1:9", "region": "us-east-1", "skip_signature": True}
    s3 = obstore.store.S3Store("b", prefix="p/q", client_options={"allow_http": True}, **anonymous)
    native = backend(s3)
    assert isinstance(native, NativeBackend) and native.base == "/b/p/q" and native.signer is None
    keyed = obstore.store.S3Store("b", region="eu-west-1", access_key_id="AK", secret_access_key="SK")
    native = backend(keyed)
    assert isinstance(native, NativeBackend) and native.host == "s3.eu-west-1.amazonaws.com"
    assert native.signer is not None and native.signer.region == "eu-west-1"
    assert backend(obstore.store.S3Store("b", region="eu-west-1")) is None  # credentials from the environment
    assert backend(obstore.store.S3Store("b", skip_signature=True)) is None  # the region from the environment
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert backend(keyed) is None  # a proxy: obstore's client knows how
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("AWS_REQUEST_PAYER", "true")
    assert backend(keyed) is None  # a header this client does not send
    monkeypatch.delenv("AWS_REQUEST_PAYER")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "ENVTOKEN")
    from_env = backend(obstore.store.S3Store("b", region="eu-west-1"))
    assert isinstance(from_env, NativeBackend) and from_env.signer is not None
    assert (from_env.signer.access_key_id, from_env.signer.token) == ("ENVKEY", "ENVTOKEN")
    keyed_env = backend(keyed)
    assert keyed_env is not None and keyed_env.signer is not None
    assert (keyed_env.signer.access_key_id, keyed_env.signer.token) == ("AK", "ENVTOKEN")  # the config's key wins
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")
    assert backend(obstore.store.S3Store("b")) is None  # which of the two obstore takes is not defined
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    regional = backend(obstore.store.S3Store("b"))
    assert regional is not None and regional.signer is not None and regional.signer.region == "us-west-2"


def _captured_heads(script_heads: list[bytes]) -> Callable[[socket.socket, int], None]:
    def script(conn: socket.socket, n: int) -> None:
        while head := _read_request(conn):
            script_heads.append(head)
            conn.sendall(
                b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-3/100\r\nContent-Length: 4\r\n\r\nbody"
            )
        conn.close()

    return script


def _request_of(head: bytes) -> tuple[str, str, str, str]:
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    credential = headers.get("authorization", "").split("Credential=")[-1].split(",")[0]
    scope = credential.split("/", 1)[0] + "/" + "/".join(credential.split("/")[2:])  # the key and scope, not the day
    return lines[0].split(" ")[1], headers["host"], scope, headers.get("x-amz-security-token", "")


@pytest.mark.parametrize("from_env", [False, True])
def test_s3_requests_go_where_and_as_whom_obstore_sends_them(scripted, monkeypatch, from_env: bool) -> None:
    """obstore is the oracle: the same store, the same key, the same path, host, credential scope and token."""
    _no_aws_environment(monkeypatch)
    heads: list[bytes] = []
    server = scripted(_captured_heads(heads))
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    settings = {"access_key_id": "AKX", "secret_access_key": "SKX", "token": "TKX", "region": "ap-south-1"}
    if from_env:
        for name, value in (
            ("AWS_ACCESS_KEY_ID", "AKX"),
            ("AWS_SECRET_ACCESS_KEY", "SKX"),
            ("AWS_SESSION_TOKEN", "TKX"),
            ("AWS_DEFAULT_REGION", "ap-south-1"),
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ALLOW_HTTP", "true"),
        ):
            monkeypatch.setenv(name, value)
        raw = obstore.store.S3Store("my-bkt", prefix="a b/pre")
    else:
        raw = obstore.store.S3Store(
            "my-bkt", prefix="a b/pre", endpoint=endpoint, client_options={"allow_http": True}, **settings
        )
    obstore.get_range(raw, "d/k~1.0", start=0, end=4)
    native = native_backend(raw, raw)
    assert native is not None

    async def ours() -> bytes:
        return bytes(await native.request("d/k~1.0", RangeByteRequest(0, 4)))

    assert asyncio.run(ours()) == b"body"
    theirs, mine = (_request_of(h) for h in heads)
    assert mine == theirs and theirs[2].startswith("AKX/ap-south-1/s3/aws4_request") and theirs[3] == "TKX"


def test_large_reads_still_stream_through_obstore(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for(BUCKET), read_only=True)
        backend = client_for(store).backend
        assert isinstance(backend, NativeBackend) and isinstance(backend, _ObstoreBackend)
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


def test_an_s3_bucket_is_read_by_the_engine_client(s3_server, s3_bucket) -> None:
    options = s3_server.client_options()
    raw = obstore.store.S3Store(s3_bucket, prefix="pre", **options)
    blobs = {f"d/k{i}": os.urandom(500 + 300 * i) for i in range(12)}
    for key, blob in blobs.items():
        obstore.put(raw, key, blob)
    store = obstore_store(f"s3://{s3_bucket}/pre", read_only=True, **options)
    client = client_for(store)
    assert isinstance(client.backend, NativeBackend) and client.backend.signer is not None
    fetcher = Fetcher(client, ReadWindow(8).user(8), PassCounters())

    async def main() -> list:
        return await asyncio.gather(
            *(fetcher.get(key) for key in blobs), fetcher.get("d/k3", RangeByteRequest(7, 99)), fetcher.get("d/none")
        )

    *answers, ranged, missing = asyncio.run(main())
    assert [a.to_bytes() for a in answers] == list(blobs.values())
    assert ranged.to_bytes() == blobs["d/k3"][7:99] and missing is None
    close_store(store)


def test_a_host_name_is_looked_up_once_for_many_new_connections(scripted, monkeypatch) -> None:
    def script(conn: socket.socket, n: int) -> None:
        while _read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
        conn.close()

    server = scripted(script)
    lookups: list[str] = []
    getaddrinfo = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def counted(self, host, *args, **kwargs):
        lookups.append(host)
        return await getaddrinfo(self, host, *args, **kwargs)

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", counted)
    pool = HttpPool("http", "localhost", server.server_address[1])

    async def main() -> list:
        head = b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n"
        return await asyncio.gather(*(pool.get(head, "/x", None) for _ in range(8)))

    answers = asyncio.run(main())
    assert [bytes(a) for a in answers] == [BODY] * 8
    assert server.connections == 8 and lookups == ["localhost"]
