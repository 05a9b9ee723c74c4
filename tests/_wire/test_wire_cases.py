"""Server and S3 behaviours of issue 44 through each client, obstore the oracle: the same bytes, or an error at once.

Per-service endpoint variables, a bucket that is not there, heads whose
lines end in a bare LF, a stray CRLF between answers on a kept-alive
connection, large chunks sent chunked, a host name with an unreachable
address first (Happy Eyeballs), and TLS session resumption with a server
that closes every connection.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Iterator

import obstore.store
import pytest
from certificates import Certificates, make_certificates
from scripted import WIRE_CLIENTS, read_many, read_through
from servers import S3Server
from zarr.abc.store import RangeByteRequest

from insitubatch.stores.read_policy import Outcome, classify
from insitubatch.stores.wire_settings import EngineSettings, engine_settings
from insitubatch.testing.emulator import Reply, Request, answer, ranged

BODY = bytes(range(256)) * 64  # 16 KiB
KEY = "d/k.0"
# S3 answers a client wants besides the length (object_store reads both from a GET's answer)
DATED = {"Last_Modified": "Mon, 01 Jan 2024 00:00:00 GMT", "ETag": '"0"'}


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


def _s3_answers(request: Request) -> bytes:
    spec = request.headers.get("range", "bytes=0-").split("=", 1)[1]
    first, _, last = spec.partition("-")
    start, stop = int(first), min(len(BODY), int(last) + 1 if last else len(BODY))
    return answer(206, BODY[start:stop], Content_Range=f"bytes {start}-{stop - 1}/{len(BODY)}", **DATED)


# -- per-service endpoint variables ------------------------------------------------------------------------------


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("config_endpoint", [False, True])
def test_aws_endpoint_url_s3_is_where_both_clients_send_every_get(scripted, monkeypatch, client, config_endpoint):
    """``AWS_ENDPOINT_URL_S3`` wins over ``AWS_ENDPOINT_URL`` and, in obstore 0.12, over the store's endpoint too."""
    generic, s3_only = scripted(_s3_answers), scripted(_s3_answers)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{generic.port}", "AWS_ENDPOINT_URL_S3": s3_only.url_for("")}
    env.update(AWS_ACCESS_KEY_ID="AKX", AWS_SECRET_ACCESS_KEY="SKX", AWS_REGION="eu-west-1", AWS_ALLOW_HTTP="true")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = {"endpoint": f"http://127.0.0.1:{generic.port}"} if config_endpoint else {}
    got = read_through(client, "s3://bkt/pre", KEY, RangeByteRequest(10, 90), **store)
    assert got == BODY[10:90]
    assert not generic.requests  # no request, signed or not, went to the other endpoint
    (request,) = s3_only.requests
    assert request.path == f"/bkt/pre/{KEY}" and request.headers["host"] == f"127.0.0.1:{s3_only.port}"
    assert "Credential=AKX/" in request.headers["authorization"]  # signed for the host it was sent to


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_plain_http_aws_endpoint_url_s3_allows_http_as_aws_endpoint_url_does(scripted, monkeypatch, client) -> None:
    server = scripted(_s3_answers)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.url_for(""))  # (MinIO on plain HTTP; no AWS_ALLOW_HTTP)
    keys = {"access_key_id": "AKX", "secret_access_key": "SKX", "region": "eu-west-1"}
    assert read_through(client, "s3://bkt/pre", KEY, RangeByteRequest(0, 64), **keys) == BODY[:64]
    assert len(server.requests) == 1


def test_the_engine_takes_the_endpoint_obstore_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2")
    keys = {"access_key_id": "AKX", "secret_access_key": "SKX", "region": "eu-west-1"}
    raw = obstore.store.S3Store("bkt", endpoint="http://127.0.0.1:3", client_options={"allow_http": True}, **keys)
    settings = engine_settings(raw)
    assert isinstance(settings, EngineSettings) and (settings.host, settings.port) == ("127.0.0.1", 2)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "")  # (obstore panics on it): obstore's client keeps the store
    assert engine_settings(raw) == "AWS_ENDPOINT_URL_S3 is set but empty"


# -- a bucket that is not there ------------------------------------------------------------------------------------

NO_SUCH_BUCKET = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchBucket</Code>'
    b"<Message>The specified bucket does not exist</Message><BucketName>bkt</BucketName></Error>"
)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_404_no_such_bucket_is_an_error_not_a_missing_chunk(scripted, client: str) -> None:
    server = scripted(lambda r: answer(404, NO_SUCH_BUCKET, Content_Type="application/xml"))
    options = {"endpoint": server.url_for(""), "allow_http": True, "region": "us-east-1"}
    options.update(access_key_id="AKX", secret_access_key="SKX")
    got = read_through(client, "s3://bkt/pre", KEY, RangeByteRequest(0, 8), **options)
    assert isinstance(got, OSError) and not isinstance(got, FileNotFoundError) or client == "obstore", got
    assert isinstance(got, Exception) and classify(got) is Outcome.FATAL, got
    assert "NoSuchBucket" in str(got) and "bkt" in str(got) and "k.0" in str(got)
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_bucket_moto_does_not_have_is_an_error_through_both_clients(signed_s3: S3Server, client: str) -> None:
    got = read_through(
        client, "s3://no-such-bucket-here/pre", KEY, RangeByteRequest(0, 8), **signed_s3.client_options()
    )
    assert isinstance(got, Exception) and classify(got) is Outcome.FATAL, got
    assert "NoSuchBucket" in str(got) and "no-such-bucket-here" in str(got) and KEY in str(got)


# -- bare-LF heads and a stray CRLF ----------------------------------------------------------------------------------


def _bare_lf(body: bytes, request: Request) -> bytes:
    """The right answer to ``request``, its head's lines ending in LF alone."""
    head, _, rest = ranged(body, request.headers.get("range")).partition(b"\r\n\r\n")
    return head.replace(b"\r\n", b"\n") + b"\n\n" + rest


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_bare_lf_heads_are_read_as_obstore_reads_them(scripted, client: str) -> None:
    server = scripted(lambda r: _bare_lf(BODY, r))
    chunked = b"HTTP/1.1 206 X\nContent-Range: bytes 0-9/%d\nTransfer-Encoding: chunked\n\na\r\n%s\r\n0\r\n\r\n"
    t0 = time.perf_counter()
    got = read_many(client, server.url_for("ds"), [(KEY, RangeByteRequest(5, 300), None), (KEY, None, None)])
    assert got == [BODY[5:300], BODY]
    assert time.perf_counter() - t0 < 10  # (not a stall: the head was in)
    if client == "engine":  # a bare-LF head of a chunked 206 (obstore's client wants a length for a range)
        server_chunked = scripted(lambda r: chunked % (len(BODY), BODY[:10]))
        assert read_through(client, server_chunked.url_for("ds"), KEY, RangeByteRequest(0, 10)) == BODY[:10]


def _stray_crlf(apart: bool):
    def script(request: Request) -> Reply:
        out = ranged(BODY, request.headers.get("range"))
        if apart:
            return Reply((out, 0.05, b"\r\n"))  # the CRLF arrives while the connection is idle
        return Reply((out + b"\r\n",))  # in the same packet as the body's end

    return script


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("apart", [False, True], ids=["with-the-body", "while-idle"])
def test_a_stray_crlf_after_a_body_is_tolerated_on_a_kept_alive_connection(scripted, client: str, apart: bool):
    server = scripted(_stray_crlf(apart))
    reads = [(KEY, RangeByteRequest(i * 100, i * 100 + 64), None) for i in range(4)]
    t0 = time.perf_counter()
    got = read_many(client, server.url_for("ds"), reads)
    assert got == [BODY[i * 100 : i * 100 + 64] for i in range(4)]
    assert time.perf_counter() - t0 < 10
    if client == "engine":
        assert len(server.connections) == 1  # the connection carried every GET


# -- a large chunk sent chunked --------------------------------------------------------------------------------------

LARGE = 32 << 20


def _chunked_206(request: Request) -> Reply:
    piece = bytes(range(256)) * 1024  # 256 KiB

    def pieces() -> Iterator[bytes]:
        yield b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-%d/%d\r\nTransfer-Encoding: chunked\r\n\r\n" % (
            LARGE - 1,
            LARGE,
        )
        for _ in range(LARGE // len(piece)):
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
        yield b"0\r\n\r\n"

    return Reply(pieces())


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_32_mib_chunk_sent_chunked_is_read_by_the_engine_or_refused_at_once(scripted, client: str) -> None:
    server = scripted(_chunked_206)
    t0 = time.perf_counter()
    (got,) = read_many(client, server.url_for("ds"), [(KEY, RangeByteRequest(0, LARGE), LARGE)])  # a pass's size hint
    if client == "engine":
        assert got == bytes(range(256)) * (LARGE // 256)
        assert len(server.requests) >= 1 and len(server.connections) == 1
    else:  # obstore's client cannot read a chunked body for a range: the same fault twice, then an error naming the key
        assert isinstance(got, OSError) and KEY in str(got) and "Content-Length" in str(got), got
        assert "twice" in str(got) and len(server.connections) == 2
    assert time.perf_counter() - t0 < 15


# -- Happy Eyeballs --------------------------------------------------------------------------------------------------


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port on ::1 whose listening socket's backlog is full: a connection attempt there never completes."""
    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::1", 0))
    listener.listen(0)
    filler = socket.socket(socket.AF_INET6)
    filler.setblocking(False)
    filler.connect_ex(("::1", listener.getsockname()[1]))
    time.sleep(0.05)
    probe = socket.socket(socket.AF_INET6)
    probe.setblocking(False)
    probe.connect_ex(("::1", listener.getsockname()[1]))
    time.sleep(0.2)
    assert probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and not _writable(probe), "not a blackhole"
    probe.close()
    yield listener.getsockname()[1]
    filler.close()
    listener.close()


def _writable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([], [sock], [], 0)[1])


def _closing(request: Request) -> bytes:
    """The right answer to ``request``, and the connection closed after it (every GET a new connection)."""
    return ranged(BODY, request.headers.get("range")).replace(b"\r\n", b"\r\nConnection: close\r\n", 1)


def test_a_name_whose_first_address_never_answers_connects_to_the_next_within_the_delay(
    scripted, blackhole: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engine only: obstore resolves names in Rust (libc), where a name with two loopback addresses cannot be made.

    obstore's client (hyper's connector) tries the next address after
    300 ms; the engine after 250 ms (RFC 8305). Without it every other
    connection waits out the 5 s connect timeout.
    """
    server = scripted(_closing)
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "twofold.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", blackhole, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", server.port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    url = f"http://twofold.test:{server.port}/ds"
    reads = [(KEY, RangeByteRequest(i, i + 50), None) for i in range(6)]
    t0 = time.perf_counter()
    got = read_many("engine", url, reads, client_options={"allow_http": True})
    elapsed = time.perf_counter() - t0
    assert got == [BODY[i : i + 50] for i in range(6)]
    assert asked and len(server.connections) == 6  # a new connection each time, half of them starting on ::1
    assert elapsed < 4.0, elapsed  # 3 x 0.25 s; one connect timeout alone is 5 s


# -- TLS session resumption ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


HANDSHAKES = 12


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_tls_sessions_are_resumed_with_a_server_that_closes_every_connection(
    scripted, certificates, monkeypatch, client
):
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    for name in ("SSL_CERT_DIR",):
        monkeypatch.delenv(name, raising=False)

    def script(request: Request) -> Reply:  # one request per connection, then a close
        return Reply(
            (ranged(BODY, request.headers.get("range")).replace(b"\r\n", b"\r\nConnection: close\r\n", 1),), "close"
        )

    server = scripted(script, tls=certificates.server_context(certificates.good))
    reads = [(KEY, RangeByteRequest(i, i + 40), None) for i in range(HANDSHAKES)]
    got = read_many(client, server.url_for("ds", host="localhost"), reads)
    assert got == [BODY[i : i + 40] for i in range(HANDSHAKES)]
    resumed = [bool(c.session_reused) for c in server.connections if c.requests]
    assert len(resumed) == HANDSHAKES
    ratio = sum(resumed) / len(resumed)
    if client == "engine":
        assert not resumed[0] and all(resumed[1:]), resumed  # every handshake after the first resumes
    else:
        assert ratio > 0, resumed  # the oracle resumes too


# -- permanent answers -----------------------------------------------------------------------------------------------

# Retry bounds that would keep a transient fault going for a minute.
PATIENT = {"max_retries": 10, "retry_timeout": datetime.timedelta(seconds=60)}
UNREADABLE = {
    # a transfer coding neither client decodes: obstore wants a length, the engine refuses all but chunked
    "gzip": b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-99/16384\r\nTransfer-Encoding: gzip\r\n\r\n" + b"\x1f\x8b" * 50,
    "gzip-chunked": b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-99/16384\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"64\r\n" + b"z" * 100 + b"\r\n0\r\n\r\n",
    # a framing fault, the same on every try
    "chunk-size": b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-99/16384\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("quirk", sorted(UNREADABLE))
def test_an_answer_the_client_cannot_read_fails_within_seconds_naming_the_key(scripted, client: str, quirk: str):
    server = scripted(lambda r: UNREADABLE[quirk])
    t0 = time.perf_counter()
    (got,) = read_many(client, server.url_for("ds"), [(KEY, RangeByteRequest(0, 100), None)], retry=PATIENT)
    assert isinstance(got, OSError) and KEY in str(got), got
    assert time.perf_counter() - t0 < 5
    if client == "engine" and quirk != "chunk-size":
        assert "Transfer-Encoding" in str(got) and len(server.requests) == 1  # refused at once
    else:
        assert "twice" in str(got) and len(server.requests) == 2  # once retried, then the same fault: not again
