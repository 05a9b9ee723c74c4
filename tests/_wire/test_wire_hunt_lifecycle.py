"""A second hunt where the engine's client and obstore's part ways: S3 answers and keys, TLS, connection lifecycle.

Each case is one server behaviour read as a pass reads it, through both
clients where obstore can be asked the same (obstore is the oracle: the
engine returns its bytes, or both fail within seconds naming the key), or
through the engine's pool alone where it is about the pool. Covered: S3
error answers (503 SlowDown and 500 InternalError, once and always, 403
AccessDenied and ExpiredToken, 404 NoSuchKey and a proxy's HTML 404, 301
PermanentRedirect with an XML body, 400 AuthorizationHeaderMalformed naming
a region, a 307 to the same host naming the bucket's region, 416, 429);
keys S3 signs specially, and keys obstore's client does not send as written
(a leading or trailing slash, ``//``, ``.`` and ``..`` segments, control
characters), read from moto with signatures checked; the request path a
key's characters make (HTTP and S3 stores); TLS bodies cut short without
close_notify, a close without close_notify after a whole body, a body
framed by the close with and without close_notify, an expired
certificate, a server that asks for a client certificate, plain HTTP at a
TLS port and TLS at a plain one; a kept-alive connection closed, reset,
answered 408 or cut inside a head as the next GET arrives, a reset or a
stall in the middle of a body, a close after the head, a server that
closes every new connection at once, many GETs in flight with one slow
answer, and a read cancelled in the middle of its body.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from certificates import Certificates, make_certificates
from scripted import WIRE_CLIENTS, read_many, read_through
from servers import LOOPBACK, S3Server
from zarr.abc.store import RangeByteRequest

from insitubatch._engine.reads.store_link import client_for
from insitubatch._wire.connection import Ask
from insitubatch._wire.faults import TlsRefusedError
from insitubatch._wire.pool import HttpPool
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.stores.read_policy import Outcome, classify
from insitubatch.testing.emulator import Reply, Request, answer, ranged

KEY = "d/k.0"
# A read that fails "at once" ends within this (each try); the fetcher's stall timer is 2 s (STALL_FLOOR_S).
AT_ONCE_S = 1.5


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


def _body_of(key: str, size: int = 4096) -> bytes:
    """Bytes that differ from key to key (and from offset to offset): an answer crossing to another GET shows."""
    seed = sum(key.encode()) % 251
    return bytes((seed + 7 * i + i // 251) % 256 for i in range(size))


def _files(request: Request, size: int = 4096) -> bytes:
    return ranged(_body_of(request.path, size), request.headers.get("range"))


def _timed(read: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    got = read()
    return got, time.perf_counter() - t0


def _failed_naming(got: object, key: str = KEY) -> bool:
    return isinstance(got, Exception) and key in str(got)


# -- S3 error answers ------------------------------------------------------------------------------------------------


def _xml(code: str, **fields: str) -> bytes:
    inner = "".join(f"<{name}>{value}</{name}>" for name, value in fields.items())
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>m</Message>{inner}'
        "<RequestId>R1</RequestId></Error>"
    ).encode()


def _s3_error(status: int, code: str, **extra: str) -> bytes:
    fields = {k: v for k, v in extra.items() if k[0].isupper()}
    headers = {k: v for k, v in extra.items() if not k[0].isupper()}
    return answer(status, _xml(code, **fields), Content_Type="application/xml", **headers)


ENDPOINT = "bkt.s3.eu-west-1.amazonaws.com"
S3_ANSWERS: dict[str, tuple[Callable[[Request, int], bytes | None], str]] = {
    # name: (the answer to the nth request, or None for the object's range; what both clients make of it)
    "503-slowdown-once": (lambda r, n: _s3_error(503, "SlowDown") if n == 0 else None, "bytes"),
    "500-internal-error-once": (lambda r, n: _s3_error(500, "InternalError") if n == 0 else None, "bytes"),
    "503-slowdown-always": (lambda r, n: _s3_error(503, "SlowDown"), "error"),
    "500-internal-error-always": (lambda r, n: _s3_error(500, "InternalError"), "error"),
    "429-slowdown-always": (lambda r, n: _s3_error(429, "SlowDown"), "error"),
    "403-access-denied": (lambda r, n: _s3_error(403, "AccessDenied"), "fatal"),
    "403-expired-token": (lambda r, n: _s3_error(403, "ExpiredToken"), "fatal"),
    "400-expired-token": (lambda r, n: _s3_error(400, "ExpiredToken"), "fatal"),
    "404-no-such-key": (lambda r, n: _s3_error(404, "NoSuchKey", Key=KEY), "missing"),
    "404-from-a-proxy-in-html": (
        lambda r, n: answer(404, b"<html><body>Not Found</body></html>", Content_Type="text/html"),
        "missing",
    ),
    "301-permanent-redirect-xml": (lambda r, n: _s3_error(301, "PermanentRedirect", Endpoint=ENDPOINT), "error"),
    "301-permanent-redirect-region": (
        lambda r, n: _s3_error(301, "PermanentRedirect", Endpoint=ENDPOINT, x_amz_bucket_region="eu-west-1"),
        "error",
    ),
    "400-authorization-header-malformed": (
        lambda r, n: _s3_error(
            400, "AuthorizationHeaderMalformed", Region="eu-west-1", x_amz_bucket_region="eu-west-1"
        ),
        "fatal",
    ),
    "307-to-the-same-host-naming-a-region": (
        lambda r, n: (
            _s3_error(307, "TemporaryRedirect", location=f"{r.path}?r=1", x_amz_bucket_region="eu-west-1")
            if "?" not in r.target
            else None
        ),
        "bytes",
    ),
    "416-invalid-range": (lambda r, n: _s3_error(416, "InvalidRange", content_range="bytes */4096"), "fatal"),
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("case", sorted(S3_ANSWERS))
def test_s3_error_answers_read_as_obstore_reads_them(scripted, client: str, case: str) -> None:
    """S3's error bodies, retried or not as obstore retries them: the range once it comes, or an error naming the key."""
    script, outcome = S3_ANSWERS[case]
    seen: list[Request] = []

    def answers(request: Request) -> bytes:
        out = script(request, len(seen))
        seen.append(request)
        return _files(request) if out is None else out

    server = scripted(answers)
    options = {"endpoint": f"http://{LOOPBACK}:{server.port}", "allow_http": True, "region": "us-east-1"}
    options.update(access_key_id="AK", secret_access_key="SK")
    got, elapsed = _timed(lambda: read_through(client, "s3://bkt/p", KEY, RangeByteRequest(0, 64), **options))
    if outcome == "bytes":
        assert got == _body_of(f"/bkt/p/{KEY}")[:64]
    elif outcome == "missing":
        assert got is None  # a missing chunk (zarr's fill value), whatever the 404's body
    else:
        assert _failed_naming(got), got
        assert elapsed < AT_ONCE_S * len(server.requests)
        if outcome == "fatal":
            assert classify(got) is Outcome.FATAL and len(server.requests) == 1  # not retried: the same every time


# -- keys: what S3 signs specially, and what obstore's client does not send as written -------------------------------

ODD_KEYS = ["sp ace/k", "plus+k", "pct%41k", "pct%k", "uni\u00fc\u6f22k", "tilde~k", "star*k", "eq=k&a", "q?k#h"]
ODD_KEYS += ["semi;k:@", "brk[k](p)", "dollar$,'!k", "caret^\\|k", 'lt<k>"`{}']
# obstore's Path drops one leading and one trailing "/" (another object, or none) and refuses the rest; sent as written,
# "dd/../k" is another key to a server that resolves dot segments
NOT_AS_WRITTEN = ["/lead", "trail/", "dbl//k", "dot/./k", "dd/../k", "ctl\x01k", "tab\tk", "del\x7fk"]


@pytest.fixture(scope="module")
def odd_bucket(signed_s3: S3Server) -> str:
    s3 = signed_s3.boto3_client()
    s3.create_bucket(Bucket="wire-odd-keys")
    for key in [*ODD_KEYS, *NOT_AS_WRITTEN, "lead", "trail"]:
        s3.put_object(Bucket="wire-odd-keys", Key=f"pre/{key}", Body=key.encode() + b" bytes")
    return "wire-odd-keys"


def _read_both(signed_s3: S3Server, bucket: str, key: str) -> dict[str, object]:
    return {c: read_through(c, f"s3://{bucket}/pre", key, **signed_s3.client_options()) for c in WIRE_CLIENTS}


@pytest.mark.parametrize("key", ODD_KEYS)
def test_keys_s3_signs_specially_are_signed_and_read_as_obstore_reads_them(
    signed_s3: S3Server, odd_bucket: str, key: str
) -> None:
    """moto checks every signature: the engine's path encoding and signature are accepted where obstore's are."""
    got = _read_both(signed_s3, odd_bucket, key)
    assert got == {c: key.encode() + b" bytes" for c in WIRE_CLIENTS}


@pytest.mark.parametrize("key", NOT_AS_WRITTEN)
def test_keys_obstore_does_not_send_as_written_read_as_obstore_reads_them(
    signed_s3: S3Server, odd_bucket: str, key: str
) -> None:
    """The engine sent them as written: "/lead" read "pre//lead", "trail/" read "pre/trail/" where obstore reads
    "pre/lead" and "pre/trail"; "dd/../k", "dbl//k" and control characters read objects obstore refuses to name."""
    engine, theirs = _read_both(signed_s3, odd_bucket, key).values()
    if isinstance(theirs, Exception):
        assert type(engine) is type(theirs) and str(engine) == str(theirs)  # obstore's own refusal, naming the key
        assert repr(key)[1:-1] in str(theirs) or key in str(theirs)
    else:
        assert engine == theirs == key.strip("/").encode() + b" bytes"


PATH_KEYS = [*ODD_KEYS, "a/.b", "...", "nel\u0085k", "zw\u200bk"]


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_a_keys_path_is_encoded_as_obstore_encodes_it(scripted, kind: str) -> None:
    """An HTTP store's path keeps "+", "=", ";", "[", "'" as they are (the engine sent "%2B" for "+": another object
    to a server that tells them apart); S3's encodes all but the unreserved characters, as SigV4 signs it."""
    targets: list[str] = []
    server = scripted(lambda r: (targets.append(r.target), answer(206, b"x", Content_Range="bytes 0-0/1"))[1])
    options: dict[str, Any] = {}
    url = server.url_for("ds")
    if kind == "s3":
        url = "s3://bkt/p"
        options = {"endpoint": f"http://{LOOPBACK}:{server.port}", "allow_http": True, "region": "us-east-1"}
        options["skip_signature"] = True
    sent: dict[str, list[str]] = {}
    for client in WIRE_CLIENTS:
        for key in PATH_KEYS:
            assert read_through(client, url, key, RangeByteRequest(0, 1), **options) == b"x"
        sent[client], targets[:] = list(targets), []
    assert sent["engine"] == sent["obstore"]


# -- TLS -------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def trusted(certificates: Certificates, monkeypatch: pytest.MonkeyPatch) -> Certificates:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    return certificates


def _cut(request: Request, after: str, keep: int = 100, size: int = 4096) -> Reply:
    out = _files(request, size)
    return Reply((out[: out.index(b"\r\n\r\n") + 4 + keep],), after)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("after", ["close", "reset"])
def test_a_tls_body_cut_short_without_close_notify_is_an_error(scripted, trusted, client: str, after: str) -> None:
    """A TLS close with no close_notify (a truncation) in the middle of a body: an error, never short bytes."""
    server = scripted(lambda r: _cut(r, after), tls=trusted.server_context(trusted.good))
    got, elapsed = _timed(lambda: read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 1000)))
    assert _failed_naming(got), got
    assert elapsed < AT_ONCE_S * len(server.requests)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_tls_close_without_close_notify_after_a_whole_body_is_fine(scripted, trusted, client: str) -> None:
    server = scripted(lambda r: Reply((_files(r),), "close"), tls=trusted.server_context(trusted.good))
    reads = [(KEY, RangeByteRequest(i * 10, i * 10 + 50), None) for i in range(3)]
    got = read_many(client, server.url_for("ds"), reads)
    assert got == [_body_of(f"/ds/{KEY}")[i * 10 : i * 10 + 50] for i in range(3)]


class _LoopbackServer:
    """A loopback TCP server handing each connection it accepts to ``serve(conn)``, on its own thread, until closed."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.serve = serve
        self.sock = socket.create_server((LOOPBACK, 0))
        self.sock.settimeout(0.05)  # (accept() returns now and then, to see close())
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            self.serve(conn)

    def close(self) -> None:
        self.closed = True
        self.thread.join(5)
        self.sock.close()


class _TlsReply:
    """A connection's handler: TLS, one GET answered with ``reply``, then a close with close_notify or not."""

    def __init__(self, context: ssl.SSLContext, reply: bytes, close_notify: bool) -> None:
        self.context, self.reply, self.close_notify = context, reply, close_notify
        self.requests = 0

    def __call__(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += tls.recv(65536)
                self.requests += 1
                tls.sendall(self.reply)
                if self.close_notify:
                    tls.unwrap().close()  # close_notify, then the TCP close
        except (OSError, ssl.SSLError):
            pass


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("close_notify", [True, False])
def test_a_tls_body_framed_by_the_close_is_whole_only_with_close_notify(trusted, client: str, close_notify) -> None:
    """RFC 9112 9.8: an unframed body over TLS is complete only at a close_notify; the engine took a bare close (a
    truncation) as its end and returned the bytes that had come. (obstore refuses any 200 to its ranged GET.)"""
    body = _body_of("whole", 3000)
    reply = _TlsReply(trusted.server_context(trusted.good), b"HTTP/1.1 200 OK\r\n\r\n" + body, close_notify)
    server = _LoopbackServer(reply)
    try:
        got, elapsed = _timed(lambda: read_through(client, f"https://{LOOPBACK}:{server.port}/ds", KEY))
    finally:
        server.close()
    if client == "engine" and close_notify:
        assert got == body
        return
    assert _failed_naming(got), got
    assert elapsed < AT_ONCE_S * reply.requests
    if client == "engine":
        assert "without close_notify" in str(got)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_an_expired_certificate_is_refused(scripted, trusted, client: str) -> None:
    server = scripted(_files, tls=trusted.server_context(trusted.expired))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 8))
    assert _failed_naming(got), got
    assert not server.requests  # no request went over an unverified connection
    if client == "engine":
        assert isinstance(got, TlsRefusedError) and classify(got) is Outcome.FATAL
        assert f"https://{LOOPBACK}:{server.port}" in str(got) and "expired" in str(got)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_server_that_asks_for_a_client_certificate_fails_each_try_at_once(scripted, trusted, client: str) -> None:
    """TLS 1.3: the client's handshake ends before the server refuses it, and the alert can come before the GET is
    sent: the engine sent it on the closed connection anyway and waited for the stall timer on that try."""
    context = trusted.server_context(trusted.good)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(trusted.ca)
    server = scripted(_files, tls=context)
    for _ in range(3):  # (whether the alert comes before the GET is a race: each run tries it three times)
        got, elapsed = _timed(lambda: read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 8)))
        assert _failed_naming(got), got
        assert elapsed < AT_ONCE_S
        if client == "engine":
            assert f"https://{LOOPBACK}:{server.port} closed" in str(got)
    assert not server.requests


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("mix", ["plain-client-at-a-tls-port", "tls-client-at-a-plain-port"])
def test_the_wrong_protocol_at_a_port_fails_at_once_naming_the_server(scripted, trusted, client: str, mix) -> None:
    """A plain GET to a TLS server, or a TLS handshake answered by a plain HTTP server (its 400 in clear text)."""
    plain = mix.startswith("plain")
    server = scripted(_files, tls=trusted.server_context(trusted.good) if plain else None)
    url = (
        server.url_for("ds").replace("https://", "http://") if plain else server.url_for("ds").replace("http", "https")
    )
    got, elapsed = _timed(lambda: read_through(client, url, KEY, RangeByteRequest(0, 8), allow_http=True))
    assert _failed_naming(got), got
    assert elapsed < AT_ONCE_S and not server.requests
    if client == "engine":
        assert f"{url.split('/ds')[0]}" in str(got)


# -- connection lifecycle: through both clients ----------------------------------------------------------------------

KEYS = ["d/a.0", "d/b.0", "d/c.0"]


def _expected(keys: list[str], size: int = 4096) -> list[bytes]:
    return [_body_of(f"/ds/{key}", size)[:1000] for key in keys]


DROPS = {  # how connection 1 answers its second GET
    "close": Reply(after="close"),
    "reset": Reply(after="reset"),
    "408-and-close": Reply((answer(408, b"idle too long", Connection="close"),), "close"),  # (as some servers time out)
    "part-of-a-head-and-close": Reply((b"HTTP/1.1 206 Partial Con",), "close"),  # (never joined to the retry's answer)
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("drop", sorted(DROPS))
def test_a_kept_alive_connection_dropped_as_the_next_get_arrives_is_retried_once(scripted, client, drop) -> None:
    """Connection 1 answers once, then drops as the second GET arrives: that GET goes once more, on a new one."""
    server = scripted(lambda r: DROPS[drop] if (r.connection, r.nth) == (1, 1) else _files(r))
    got = read_many(client, server.url_for("ds"), [(key, RangeByteRequest(0, 1000), None) for key in KEYS])
    assert got == _expected(KEYS)
    assert [r.path for r in server.requests].count(f"/ds/{KEYS[1]}") == 2  # sent twice, never three times


SIZE = 400_000  # (past the engine's low-water mark: the rest of a body is awaited in one wake-up)
BODY_FAULTS = {  # name: what the first GET gets (then every GET is answered)
    "reset-mid-body": lambda r: _cut(r, "reset", 100_000, SIZE),
    "close-after-the-head": lambda r: _cut(r, "close", 0, SIZE),
    "stall-mid-body": lambda r: _cut(r, "hold", 100_000, SIZE),
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize(
    "fault", [pytest.param(f, marks=[pytest.mark.slow] if "stall" in f else []) for f in BODY_FAULTS]
)
def test_a_body_that_breaks_once_is_read_again_whole(scripted, client: str, fault: str) -> None:
    """A reset, a close after the head, a stall with the socket kept open: the retry reads the right bytes."""

    def answers(request: Request) -> bytes | Reply:
        return BODY_FAULTS[fault](request) if request.connection == 1 else _files(request, SIZE)

    server = scripted(answers)
    want = _body_of(f"/ds/{KEY}", SIZE)[:300_000]
    got, elapsed = _timed(lambda: read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 300_000)))
    assert got == want
    assert len(server.requests) == 2
    assert elapsed < (2.0 + 2 * AT_ONCE_S if "stall" in fault else AT_ONCE_S)  # a stall ends at the stall timer (2 s)


@pytest.fixture
def slammer() -> Iterator[_LoopbackServer]:
    """A server that closes every connection as soon as it accepts it."""
    server = _LoopbackServer(lambda conn: conn.close())
    yield server
    server.close()


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_server_that_closes_every_new_connection_fails_each_try_at_once(
    slammer: _LoopbackServer, client: str
) -> None:
    url = f"http://{LOOPBACK}:{slammer.port}/ds"
    for _ in range(3):
        got, elapsed = _timed(lambda: read_through(client, url, KEY, RangeByteRequest(0, 8)))
        assert _failed_naming(got), got
        assert elapsed < AT_ONCE_S
        if client == "engine":
            assert f"http://{LOOPBACK}:{slammer.port} closed" in str(got)
    assert slammer.accepted >= 3


# -- connection lifecycle: the engine's pool -------------------------------------------------------------------------


def test_many_gets_in_flight_with_one_slow_answer_each_get_their_own_bytes(scripted) -> None:
    """Three rounds of 16 GETs at once, one answer slow in each: every key gets its own bytes, connections reused."""

    def answers(request: Request) -> bytes | Reply:
        out = _files(request)
        if request.path.endswith("/k5"):  # its head and half its body, a pause, then the rest
            return Reply((out[:-2000], 0.3, out[-2000:]))
        return out

    server = scripted(answers)
    opened = obstore_store(server.url_for("ds"), read_only=True, client="engine")
    try:
        backend = client_for(opened).backend
        keys = [f"k{i}" for i in range(16)]

        async def rounds() -> list[list[bytes]]:
            out = []
            for r in range(3):
                futures = backend.request_many([(key, RangeByteRequest(r, 3000 + r)) for key in keys])
                out.append([bytes(got) for got in await asyncio.gather(*futures)])
            return out

        got = asyncio.run(rounds())
    finally:
        close_store(opened)
    assert got == [[_body_of(f"/ds/{key}")[r : 3000 + r] for key in keys] for r in range(3)]
    assert len(server.connections) <= 16  # the later rounds went on the first round's connections


def test_a_read_cancelled_mid_body_never_leaves_bytes_for_the_next_get(scripted) -> None:
    """Its connection closes: the rest of its answer, still arriving, can never land in the next GET's body."""

    def answers(request: Request) -> Reply:
        out = _files(request)
        return Reply((out[:-1000], 0.3, out[-1000:])) if request.path == "/slow" else Reply((out,))

    server = scripted(answers)
    pool = HttpPool("http", LOOPBACK, server.port)

    def ask(path: str) -> tuple[bytes, Ask]:
        head = f"GET {path} HTTP/1.1\r\nHost: x\r\nRange: bytes=0-4095\r\n\r\n".encode()
        return head, Ask(None, path.lstrip("/"), None, path, "0-4095", (0, 4096))

    async def main() -> tuple[bytes, bytes]:
        slow = pool.get(*ask("/slow"))
        await asyncio.sleep(0.1)  # its head and most of its body are in
        slow.cancel()
        first = bytes(await asyncio.wait_for(pool.get(*ask("/next")), 5))
        await asyncio.sleep(0.4)  # the slow answer's rest has been sent by now
        second = bytes(await asyncio.wait_for(pool.get(*ask("/then")), 5))
        return first, second

    try:
        first, second = asyncio.run(main())
    finally:
        pool.close()
    assert (first, second) == (_body_of("/next"), _body_of("/then"))
    assert len(server.connections) == 2  # the cancelled GET's connection was not reused
