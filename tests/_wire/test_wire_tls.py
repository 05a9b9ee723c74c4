"""HTTPS through each client: verification always on, a wrong name refused, a custom CA honoured as obstore honours it.

A CA and server certificates are made in the test (``cryptography``); the
servers are scripted emulators speaking TLS. obstore trusts the CAs
that ``SSL_CERT_FILE`` names (and a store's ``root_certificate``); so does
the engine.
"""

from __future__ import annotations

import pytest
from certificates import Certificates, make_certificates
from scripted import WIRE_CLIENTS, read_through
from zarr.abc.store import RangeByteRequest

from insitubatch._wire.faults import TlsRefusedError
from insitubatch.stores.read_policy import Outcome, classify
from insitubatch.testing.emulator import Request, answer, ranged

BODY = bytes(range(256)) * 8
KEY = "d/c/0"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


def _files(request: Request) -> bytes:
    return ranged(BODY, request.headers.get("range"))


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_certificate_from_an_unknown_ca_is_refused(scripted, certificates: Certificates, client: str) -> None:
    server = scripted(_files, tls=certificates.server_context(certificates.good))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 8))
    assert isinstance(got, Exception), got
    assert not server.requests  # no request went over an unverified connection
    if client == "engine":
        assert isinstance(got, TlsRefusedError) and classify(got) is Outcome.FATAL
        assert f"https://127.0.0.1:{server.port}" in str(got) and "certificate" in str(got)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("how", ["SSL_CERT_FILE", "root_certificate"])
def test_a_custom_ca_is_honoured(scripted, certificates: Certificates, monkeypatch, client: str, how: str) -> None:
    server = scripted(_files, tls=certificates.server_context(certificates.good))
    options = {}
    if how == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    else:
        options["client_options"] = {"root_certificate": certificates.ca.read_text()}
    for host in ("127.0.0.1", "localhost"):  # an IP address and a name, each in the certificate
        url = server.url_for("ds", host=host)
        assert read_through(client, url, KEY, RangeByteRequest(2, 30), **options) == BODY[2:30]
        assert read_through(client, url, KEY, **options) == BODY


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_certificate_for_another_name_is_refused(scripted, certificates: Certificates, monkeypatch, client) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    server = scripted(_files, tls=certificates.server_context(certificates.wrong))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 8))
    assert isinstance(got, Exception), got
    assert not server.requests
    if client == "engine":
        assert isinstance(got, TlsRefusedError) and "127.0.0.1" in str(got)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_an_https_host_behind_a_redirect_is_read(scripted, certificates: Certificates, monkeypatch, client) -> None:
    """The CDN case: the origin answers 302 to another HTTPS name, which serves the bytes."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    context = certificates.server_context(certificates.good)
    edge = scripted(_files, tls=context)
    origin = scripted(
        lambda r: answer(302, Location=edge.url_for(f"cache{r.path}", host="localhost")),
        tls=context,
    )
    got = read_through(client, origin.url_for("ds"), KEY, RangeByteRequest(5, 25))
    assert got == BODY[5:25]
    assert edge.requests[0].path == f"/cache/ds/{KEY}" and edge.requests[0].headers["host"].startswith("localhost:")
