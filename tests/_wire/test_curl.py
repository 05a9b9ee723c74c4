"""The libcurl client (``insitubatch[curl]``): bytes equal the files, errors sorted as the engine's own client's, no socket left.

Skipped as a whole where pycurl is not installed (the ``curl`` extra).
"""

from __future__ import annotations

import asyncio
import calendar
import datetime
import http.server
import ipaddress
import os
import socket
import socketserver
import ssl
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import obstore.store
import pytest
import zarr
from helpers import assert_batch_matches, smooth_field, write_array
from scripted import SHUTDOWN_POLL_S
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.errors import ZarrUserWarning

pytest.importorskip("pycurl")

from insitubatch._engine.reads.fetch import Fetcher  # noqa: E402
from insitubatch._engine.reads.read_policy import Outcome, ReadPolicy, classify  # noqa: E402
from insitubatch._engine.reads.store_link import StoreClient, StoreLink, client_for  # noqa: E402
from insitubatch._engine.reads.window import ReadWindow  # noqa: E402
from insitubatch._engine.stats import PassCounters  # noqa: E402
from insitubatch._wire.curl import CurlBackend, curl_backend  # noqa: E402
from insitubatch._wire.faults import (  # noqa: E402
    HttpStatusError,
    RangeIgnoredError,
    RangeMismatchError,
    RedirectError,
    TlsRefusedError,
)
from insitubatch._wire.redirects import MAX_REDIRECTS  # noqa: E402
from insitubatch._wire.sigv4 import SigV4  # noqa: E402
from insitubatch.dataset import InSituDataset  # noqa: E402
from insitubatch.io.group import open_geometries  # noqa: E402
from insitubatch.io.owned import close_store  # noqa: E402
from insitubatch.io.stores import obstore_store  # noqa: E402
from insitubatch.plan.splits import split_by_chunk  # noqa: E402

BUCKET = "bkt"
KEYS = 40
# Every await on a loopback GET is bounded by this (a hung client fails instead of waiting for pytest's timeout).
WAIT_S = 20.0


@pytest.fixture
def root(emulator) -> Path:
    base = emulator.root / BUCKET / "d"
    base.mkdir(parents=True)
    for i in range(KEYS):
        (base / f"k{i}").write_bytes(os.urandom(1000 + 997 * i))
    (base / "big").write_bytes(os.urandom(3 << 20))  # several of libcurl's receive buffers
    (base / "empty").write_bytes(b"")
    return emulator.root


def _file(root: Path, key: str) -> bytes:
    return (root / BUCKET / key).read_bytes()


def _backend(url: str, **options: Any) -> CurlBackend:
    raw = obstore.store.HTTPStore.from_url(url, client_options={"allow_http": True, **options})
    backend = curl_backend(raw, raw)
    assert isinstance(backend, CurlBackend)
    return backend


def _fetcher(backend: CurlBackend, policy: ReadPolicy | None = None) -> Fetcher:
    client = StoreClient(backend, policy or ReadPolicy(), StoreLink(f"test-curl-{id(backend)}"))
    return Fetcher(client, ReadWindow(16).user(16), PassCounters())


def _run(backend: CurlBackend, key: str, byte_range: Any = None) -> Any:
    """One GET's body, or its exception."""

    async def main() -> Any:
        try:
            return bytes(await asyncio.wait_for(backend.request(key, byte_range), WAIT_S))
        except Exception as exc:
            return exc

    return asyncio.run(main())


def _sockets_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (from /proc, not from the client's books)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes and int(fields[2].split(":")[1], 16) == port and fields[3] == "01":
            count += 1
    return count


def _until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- bytes ----------------------------------------------------------------------------------------------------------
def test_reads_equal_the_files_whole_ranged_offset_suffix_empty_and_missing(emulator, root: Path) -> None:
    backend = _backend(emulator.url_for(BUCKET))
    fetcher = _fetcher(backend)
    data = _file(root, "d/k7")

    async def main() -> list:
        return await asyncio.wait_for(
            asyncio.gather(
                fetcher.get("d/k7"),
                fetcher.get("d/k7", RangeByteRequest(10, 500)),
                fetcher.get("d/k7", OffsetByteRequest(1234)),
                fetcher.get("d/k7", SuffixByteRequest(77)),
                fetcher.get("d/k7", SuffixByteRequest(10**9)),  # more than the object: all of it
                fetcher.get("d/k7", RangeByteRequest(100, 10**9)),  # past the end: to the end
                fetcher.get("d/empty"),
                fetcher.get("d/nothing-here"),
                fetcher.get("d/big"),
                *(fetcher.get(f"d/k{i}") for i in range(KEYS)),
            ),
            WAIT_S,
        )

    whole, ranged, offset, suffix, longer, past, empty, missing, big, *every = asyncio.run(main())
    assert whole.to_bytes() == data
    assert ranged.to_bytes() == data[10:500]
    assert offset.to_bytes() == data[1234:]
    assert suffix.to_bytes() == data[-77:]
    assert longer.to_bytes() == data and past.to_bytes() == data[100:]
    assert empty.to_bytes() == b""
    assert missing is None
    assert big.to_bytes() == _file(root, "d/big")
    assert [b.to_bytes() for b in every] == [_file(root, f"d/k{i}") for i in range(KEYS)]
    # every read once, and the empty object's plain GET after its ranged one was refused (416)
    assert emulator.stats().gets == 9 + KEYS + 1 and fetcher.counters.retries == 0
    backend.close()


def test_s3_reads_are_signed_as_s3_checks_and_equal_the_objects(signed_s3, no_aws_environment) -> None:
    """moto with signature checks on: every libcurl GET is signed by CURLOPT_AWS_SIGV4 and accepted."""
    options = signed_s3.options()
    options.pop("allow_http")  # a client option, not an S3 setting
    raw = obstore.store.S3Store("bkt", prefix="pre fix", client_options={"allow_http": True}, **options)
    import boto3

    boto3.client(
        "s3",
        endpoint_url=signed_s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=signed_s3.access_key_id,
        aws_secret_access_key=signed_s3.secret_access_key,
    ).create_bucket(Bucket="bkt")
    objects = {f"d/k{i}.0": os.urandom(500 + 1013 * i) for i in range(12)}
    for key, value in objects.items():
        obstore.put(raw, key, value)
    obstore.put(raw, "d/empty", b"")
    backend = curl_backend(raw, raw)
    assert isinstance(backend, CurlBackend) and backend.settings.engine.keys is not None
    fetcher = _fetcher(backend)

    async def main() -> list:
        reads = [fetcher.get(k) for k in objects]
        reads += [fetcher.get("d/k5.0", RangeByteRequest(3, 300)), fetcher.get("d/k5.0", SuffixByteRequest(9))]
        reads += [fetcher.get("d/empty"), fetcher.get("d/absent")]
        return await asyncio.wait_for(asyncio.gather(*reads), WAIT_S)

    *bodies, ranged, suffix, empty, absent = asyncio.run(main())
    assert [b.to_bytes() for b in bodies] == list(objects.values())
    assert ranged.to_bytes() == objects["d/k5.0"][3:300] and suffix.to_bytes() == objects["d/k5.0"][-9:]
    assert empty.to_bytes() == b"" and absent is None
    backend.close()
    wrong = {**options, "secret_access_key": "not-the-secret"}
    forged = curl_backend(obstore.store.S3Store("bkt", client_options={"allow_http": True}, **wrong), raw)
    assert forged is not None
    denied = _run(forged, "pre fix/d/k1.0")
    assert isinstance(denied, PermissionError) and classify(denied) is Outcome.FATAL  # the check is real


# -- scripted servers -------------------------------------------------------------------------------------------------
class _Scripted(socketserver.ThreadingTCPServer):
    """A loopback server whose every connection runs ``script(conn, n)``: raw bytes, any answer."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        self.script = script
        self.connections = 0
        self.heads: list[bytes] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with outer.lock:
                    outer.connections += 1
                    n = outer.connections
                outer.script(self.request, n)

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def read_head(self, conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = conn.recv(4096)
            if not piece:
                return b""
            data += piece
        with self.lock:
            self.heads.append(data)
        return data

    def targets(self) -> list[str]:
        return [head.split(b" ", 2)[1].decode() for head in self.heads]


@pytest.fixture
def script_server() -> Iterator[Callable[[Callable[[socket.socket, int], None]], _Scripted]]:
    servers: list[_Scripted] = []

    def start(script: Callable[[socket.socket, int], None]) -> _Scripted:
        server = _Scripted(script)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _answering(answer: Callable[[bytes], bytes], server_box: list) -> Callable[[socket.socket, int], None]:
    """A script that answers every request on a connection with ``answer(request head)``."""

    def script(conn: socket.socket, n: int) -> None:
        while head := server_box[0].read_head(conn):
            conn.sendall(answer(head))
        conn.close()

    return script


def _serve(script_server, answer: Callable[[bytes], bytes]) -> _Scripted:
    box: list = []
    server = script_server(_answering(answer, box))
    box.append(server)
    return server


BODY = bytes(range(256)) * 40


def test_redirects_are_followed_with_their_query_strings_and_a_loop_is_fatal(script_server) -> None:
    def answer(head: bytes) -> bytes:
        target = head.split(b" ", 2)[1]
        if target.startswith(b"/base/gone"):
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        if target.startswith(b"/base/"):
            return b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /moved/k?tok=1&hop=2\r\nContent-Length: 0\r\n\r\n"
        if target.startswith(b"/loop"):
            return b"HTTP/1.1 302 Found\r\nLocation: /loop\r\nContent-Length: 3\r\n\r\nxyz"
        start, end = 10, 109
        return (
            b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n"
            % (start, end, len(BODY), end - start + 1)
            + BODY[start : end + 1]
        )

    server = _serve(script_server, answer)
    backend = _backend(f"{server.url}/base?tok=1")  # a tokened URL: the query goes after every key
    assert _run(backend, "k", RangeByteRequest(10, 110)) == BODY[10:110]
    assert server.targets() == ["/base/k?tok=1", "/moved/k?tok=1&hop=2"]
    assert server.heads[1].lower().count(b"range: bytes=10-109") == 1  # the range goes along
    gone = _run(backend, "gone")
    assert isinstance(gone, FileNotFoundError) and "/base/gone" in str(gone) and "tok" not in str(gone)  # no token
    looping = _run(_backend(f"{server.url}/loop"), "x")
    assert isinstance(looping, RedirectError) and classify(looping) is Outcome.FATAL
    assert f"more than {MAX_REDIRECTS} redirects" in str(looping)
    assert server.targets().count("/loop") == MAX_REDIRECTS and server.targets().count("/loop/x") == 1
    backend.close()


def test_answered_ranges_are_checked_and_a_server_that_ignores_the_range_is_cut(script_server) -> None:
    answers = {
        b"/wrong": b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/10240\r\nContent-Length: 100\r\n\r\n"
        + BODY[:100],
        b"/ignored": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
        b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(
            b"%x\r\n" % len(BODY[i : i + 3000]) + BODY[i : i + 3000] + b"\r\n" for i in range(0, len(BODY), 3000)
        )
        + b"0\r\n\r\n",
        b"/long": b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 5-9/10240\r\nContent-Length: 5\r\n\r\n"
        + BODY[5:10],
    }
    server = _serve(script_server, lambda head: answers[head.split(b" ", 2)[1]])
    backend = _backend(server.url)
    wrong = _run(backend, "wrong", RangeByteRequest(100, 200))
    assert isinstance(wrong, RangeMismatchError) and classify(wrong) is Outcome.RETRY
    assert "asked bytes=100-199" in str(wrong) and "0-99/10240" in str(wrong)
    assert _run(backend, "ignored", RangeByteRequest(100, 200)) == BODY[100:200]
    assert _run(backend, "ignored", SuffixByteRequest(50)) == BODY[-50:]
    assert _run(backend, "chunked") == BODY
    short = _run(backend, "long", RangeByteRequest(5, 20))  # the object is longer: a 206 of 5 bytes is wrong
    assert isinstance(short, RangeMismatchError)
    backend.close()


def test_statuses_are_sorted_as_the_engine_sorts_them(emulator, root: Path) -> None:
    for kind, key in (("403", "k1"), ("404", "k2"), ("500", "k3"), ("503", "k4")):
        emulator.inject(kind, f"{BUCKET}/d/{key}")
    backend = _backend(emulator.url_for(BUCKET))
    denied, missing, failed, throttled, absent = (_run(backend, f"d/{k}") for k in ("k1", "k2", "k3", "k4", "none"))
    assert isinstance(denied, PermissionError) and classify(denied) is Outcome.FATAL
    assert isinstance(missing, FileNotFoundError) and classify(missing) is Outcome.MISSING
    assert isinstance(absent, FileNotFoundError) and "status code: 404" in str(absent)
    assert isinstance(failed, HttpStatusError) and failed.status == 500 and classify(failed) is Outcome.RETRY
    assert isinstance(throttled, HttpStatusError) and classify(throttled) is Outcome.THROTTLE
    assert _run(backend, "d/k5") == _file(root, "d/k5")  # the kept-alive connection still serves
    backend.close()


@pytest.mark.parametrize("kind", ["reset", "truncate"])
def test_a_body_cut_mid_way_is_transient_and_the_retry_reads_it(emulator, root: Path, kind: str) -> None:
    emulator.inject(kind, f"{BUCKET}/d/k30", times=1)
    backend = _backend(emulator.url_for(BUCKET))
    cut = _run(backend, "d/k30")
    assert isinstance(cut, ConnectionResetError) and classify(cut) is Outcome.RETRY
    emulator.inject(kind, f"{BUCKET}/d/k31", times=1)
    fetcher = _fetcher(backend)

    async def main() -> Any:
        return await asyncio.wait_for(fetcher.get("d/k31"), WAIT_S)

    assert asyncio.run(main()).to_bytes() == _file(root, "d/k31")
    assert fetcher.counters.retries == 1
    backend.close()


def test_a_cancelled_get_closes_its_transfer_and_its_connection(emulator, root: Path) -> None:
    emulator.configure(hold_key=f"{BUCKET}/d/k9")
    backend = _backend(emulator.url_for(BUCKET))

    async def main() -> bytes:
        future = backend.request("d/k9")
        await asyncio.sleep(0.3)
        assert _sockets_to(emulator.port) == 1
        future.cancel()
        await asyncio.sleep(0.1)
        assert _sockets_to(emulator.port) == 0
        return bytes(await asyncio.wait_for(backend.request("d/k8"), WAIT_S))  # the client still serves

    assert asyncio.run(main()) == _file(root, "d/k8")
    assert _until(lambda: emulator.stats().abandoned == 1)
    backend.close()


def test_silence_past_the_read_timeout_and_a_refused_connection_are_transient(emulator, root: Path) -> None:
    emulator.configure(hold_key=f"{BUCKET}/d/k9")
    backend = _backend(emulator.url_for(BUCKET), read_timeout="1s")
    t0 = time.monotonic()
    silent = _run(backend, "d/k9")
    assert isinstance(silent, TimeoutError) and classify(silent) is Outcome.RETRY
    assert 0.9 < time.monotonic() - t0 < 1.0 + 3.0  # libcurl checks its low-speed limit once a second
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    refused = _run(_backend(f"http://127.0.0.1:{port}/x"), "k")
    assert isinstance(refused, ConnectionRefusedError) and classify(refused) is Outcome.RETRY
    backend.close()


# -- TLS -----------------------------------------------------------------------------------------------------------------
def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "insitubatch test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls_is_verified_against_the_trust_store_python_uses(tmp_path: Path, monkeypatch) -> None:
    cert, key = _self_signed(tmp_path)
    (tmp_path / "obj").write_bytes(BODY)

    class Handler(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    try:
        untrusted = _run(_backend(url), "obj")
        assert isinstance(untrusted, TlsRefusedError) and classify(untrusted) is Outcome.FATAL
        assert "certificate" in str(untrusted)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # what Python's ssl (and so this client) trusts
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        trusted = _backend(url)
        assert _run(trusted, "obj") == BODY
        trusted.close()
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- signing -------------------------------------------------------------------------------------------------------------
def _no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode().split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}


@pytest.mark.parametrize("token", [None, "TK/X+="])
def test_libcurl_signs_s3_gets_as_sigv4_and_obstore_do(script_server, monkeypatch, token: str | None) -> None:
    """libcurl's CURLOPT_AWS_SIGV4: obstore's path, host and token, and _wire.sigv4's signature.

    obstore also signs the ``Range`` header; the engine's SigV4 and libcurl do not (S3 accepts either).
    """
    _no_aws_environment(monkeypatch)
    server = _serve(
        script_server,
        lambda head: b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-3/100\r\nContent-Length: 4\r\n\r\nbody",
    )
    keys = {"access_key_id": "AKX", "secret_access_key": "SK/X+", "region": "ap-south-1"}
    if token:
        keys["token"] = token
    raw = obstore.store.S3Store(
        "my-bkt", prefix="a b/pre", endpoint=server.url, client_options={"allow_http": True}, **keys
    )
    obstore.get_range(raw, "d/k~1.0", start=0, end=4)
    backend = curl_backend(raw, raw)
    assert backend is not None
    assert _run(backend, "d/k~1.0", RangeByteRequest(0, 4)) == b"body"
    theirs, mine = (_headers(h) for h in server.heads)
    assert server.targets()[0] == server.targets()[1] == "/my-bkt/a%20b/pre/d/k~1.0"
    assert mine["host"] == theirs["host"] and mine.get("x-amz-security-token") == theirs.get("x-amz-security-token")
    signed = [h["authorization"].split("SignedHeaders=")[1].split(",")[0] for h in (mine, theirs)]
    assert signed[0] == signed[1].replace("range;", "")
    now = calendar.timegm(time.strptime(mine["x-amz-date"], "%Y%m%dT%H%M%SZ"))
    expected = SigV4("AKX", "SK/X+", "ap-south-1", token).headers(mine["host"], server.targets()[1], now=now)
    assert f"Authorization: {mine['authorization']}\r\n" in expected
    backend.close()


# -- which stores -----------------------------------------------------------------------------------------------------
def test_libcurl_reads_the_stores_the_engine_reads_with_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_environment(monkeypatch)

    def backend(raw: Any) -> CurlBackend | None:
        return curl_backend(raw, raw)

    tokened = obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x?sig=1", client_options={"allow_http": True})
    http_store = backend(tokened)
    assert http_store is not None and (http_store.origin, http_store.path, http_store.query) == (
        "http://127.0.0.1:9",
        "/x",
        "?sig=1",
    )
    assert backend(obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x")) is None  # obstore refuses plain http
    headers = {"allow_http": True, "default_headers": {"x-a": "b"}}
    assert backend(obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x", client_options=headers)) is None
    tuned = {"timeout": "9s", "read_timeout": "3s", "connect_timeout": "250ms", "http1_only": True, "user_agent": "t/1"}
    settings = backend(obstore.store.HTTPStore.from_url("https://example.test/x", client_options=tuned)).settings  # type: ignore[union-attr]
    assert (settings.timeout_s, settings.read_timeout_s, settings.http1_only) == (9.0, 3.0, True)
    assert (settings.engine.connect_timeout_s, settings.engine.user_agent) == (0.25, "t/1")
    anonymous = {"endpoint": "http://127.0.0.1:9", "region": "us-east-1", "skip_signature": True}
    s3 = backend(obstore.store.S3Store("b", prefix="p/q", client_options={"allow_http": True}, **anonymous))
    assert s3 is not None and (s3.origin, s3.path, s3.settings.sigv4()) == ("http://127.0.0.1:9", "/b/p/q", None)
    keyed = obstore.store.S3Store("b", region="eu-west-1", access_key_id="AK", secret_access_key="SK")
    signed = backend(keyed)
    assert signed is not None and (signed.origin, signed.path) == ("https://s3.eu-west-1.amazonaws.com:443", "/b")
    assert (
        signed.settings.sigv4() == "aws:amz:eu-west-1:s3"
        and signed.settings.sigv4("us-west-2") == "aws:amz:us-west-2:s3"
    )
    assert backend(obstore.store.S3Store("b", region="eu-west-1")) is None  # credentials from a chain
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert backend(keyed) is None  # the environment's proxy: obstore's client
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "ENVTOKEN")
    from_env = backend(keyed)
    assert from_env is not None and from_env.settings.headers()[-1] == "x-amz-security-token: ENVTOKEN"


HUGE = 64 << 20
PIECE = bytes(range(256)) * 256  # 64 KiB


def test_a_large_object_sent_whole_for_a_range_is_cut_or_refused_without_receiving_it(script_server) -> None:
    sent: list[int] = []

    def script(conn: socket.socket, n: int) -> None:
        while server.read_head(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
            total = 0
            try:
                while total < HUGE:
                    conn.sendall(PIECE)
                    total += len(PIECE)
            except OSError:  # the client stopped reading and closed: what it cost is what went out
                sent.append(total)
                break
        conn.close()

    server = script_server(script)
    backend = _backend(server.url)
    assert _run(backend, "k", RangeByteRequest(0, 16)) == PIECE[:16]  # the range's bytes, then it stops
    refused = _run(backend, "k", RangeByteRequest(4 << 20, (4 << 20) + 16))  # far in: refused at the head
    assert isinstance(refused, RangeIgnoredError) and classify(refused) is Outcome.FATAL and "Range" in str(refused)
    suffix = _run(backend, "k", SuffixByteRequest(16))
    assert isinstance(suffix, RangeIgnoredError)
    assert _until(lambda: len(sent) == 3) and max(sent) < HUGE // 4  # the rest never crossed the wire
    backend.close()


# -- connections and the engine --------------------------------------------------------------------------------------
def test_connections_are_reused_and_closed_with_their_loop_and_by_close(emulator, root: Path) -> None:
    emulator.configure(latency_s=0.005)
    backend = _backend(emulator.url_for(BUCKET))
    opened: list[int] = []

    async def rounds() -> None:
        for _ in range(5):  # 5 rounds of 8 at once: 8 connections, reused
            await asyncio.wait_for(asyncio.gather(*(backend.request(f"d/k{i}") for i in range(8))), WAIT_S)
        opened.append(_sockets_to(emulator.port))

    asyncio.run(rounds())
    assert opened == [8]
    assert _sockets_to(emulator.port) == 0  # asyncio.run ended the loop: its connections closed with it
    assert emulator.stats().gets == 40

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(rounds(), loop).result(WAIT_S)
        assert opened[-1] == 8
        backend.close()  # from this thread: the loop's thread closes them
        assert _until(lambda: _sockets_to(emulator.port) == 0)
        assert asyncio.run_coroutine_threadsafe(_one(backend, "d/k3"), loop).result(WAIT_S) == _file(root, "d/k3")
    finally:
        backend.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _one(backend: CurlBackend, key: str) -> bytes:
    return bytes(await backend.request(key))


def test_a_pass_read_through_libcurl_equals_zarr(emulator) -> None:
    rng = np.random.default_rng(5)
    group = zarr.open_group(emulator.root / "p.zarr", mode="w")
    write_array(group, "v", smooth_field(rng, (48, 6, 8)), (4, 3, 8))
    write_array(group, "s", smooth_field(rng, (48, 6, 8)), (2, 3, 8), shards=(4, 6, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(group.store)
    local = zarr.open_group(emulator.root / "p.zarr", mode="r")
    data = {name: local[name][...] for name in ("v", "s")}
    store = obstore_store(emulator.url_for("p.zarr"), read_only=True)
    client = client_for(store)
    backend = curl_backend(store.store, client.backend.raw)  # the engine's store link, libcurl on the wire
    assert backend is not None
    client.backend = backend
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["v"], fractions=(0.75, 0.25))
    emulator.reset_stats()
    with InSituDataset(store, manifest, geoms, batch_size=5, seed=2) as ds:
        batches = 0
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, data)
            batches += 1
        assert batches == len(ds.train)
    assert emulator.stats().gets > 0 and _sockets_to(emulator.port) <= 64
    close_store(store)
