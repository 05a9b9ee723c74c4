"""Whole passes through the public API over each client, every batch compared with zarr-python's read.

``obstore_store(url, client=...)`` + ``open_geometries`` + ``split_by_chunk``
+ ``InSituDataset`` iterating a split (``datasets.check_pass``), against
servers that need what the issue found missing: a URL token, a redirect to
another host, HTTPS with a private CA, S3 with signatures checked, a
virtual-hosted bucket behind an endpoint; and one that sends a wrong range.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from certificates import make_certificates
from datasets import BATCH_SIZE, GROUP, check_pass, write_group
from helpers import assert_batch_matches
from scripted import WIRE_CLIENTS
from servers import S3Server

from insitubatch.dataset import InSituDataset
from insitubatch.errors import StoreReadError
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator, Request, answer


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def served(tmp_path: Path, scripted):
    """The group's data, and ``serve(script=None, tls=None)``: an emulator of ``tmp_path`` (the script first)."""
    data = write_group(tmp_path)

    def serve(script=None, *, tls=None) -> Emulator:
        return scripted(script, root=tmp_path, tls=tls)

    return data, serve


def _token(token: str):
    """Every request must carry ``token`` as its query string, else 403."""
    return lambda r: None if r.query == token else answer(403, b"<Error>AuthenticationFailed</Error>")


def _redirect(to: str):
    """Chunk requests (paths with ``/c/``) are sent to ``to`` with a 302."""
    return lambda r: answer(302, Location=f"{to.rstrip('/')}{r.path}") if "/c/" in r.path else None


def _chunk_gets(server: Emulator) -> int:
    return sum("/c/" in r.path for r in server.requests)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_url_with_a_token_is_read_whole(served, client: str) -> None:
    data, serve = served
    token = "sv=2024-05-04&se=2099-01-01T00%3A00%3A00Z&sp=rl&sig=YWJj%2Fx%3D"
    server = serve(_token(token))
    info = check_pass(f"{server.url_for(GROUP)}?{token}", data, client=client)
    assert info["client"]["client"] == client
    assert _chunk_gets(server) > 0 and all(r.query == token for r in server.requests)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_chunks_behind_a_redirect_to_another_host_are_read(served, client: str) -> None:
    data, serve = served
    cdn = serve()
    origin = serve(_redirect(cdn.url_for("")))
    check_pass(origin.url_for(GROUP), data, client=client)
    assert _chunk_gets(origin) > 0 and _chunk_gets(cdn) == _chunk_gets(origin)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_https_with_a_private_ca_is_read(served, client: str, monkeypatch, tmp_path_factory) -> None:
    data, serve = served
    certificates = make_certificates(tmp_path_factory.mktemp("ca"))
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    server = serve(tls=certificates.server_context(certificates.good))
    check_pass(server.url_for(GROUP, host="localhost"), data, client=client)
    assert _chunk_gets(server) > 0


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_signed_bucket_is_read(served, client: str, signed_s3: S3Server, tmp_path: Path) -> None:
    data, _ = served
    s3 = signed_s3.boto3_client()
    bucket = f"wire-e2e-{client}"
    s3.create_bucket(Bucket=bucket)
    for path in (tmp_path / GROUP).rglob("*"):
        if path.is_file():
            s3.put_object(Bucket=bucket, Key=f"ds/{path.relative_to(tmp_path).as_posix()}", Body=path.read_bytes())
    info = check_pass(f"s3://{bucket}/ds/{GROUP}", data, client=client, **signed_s3.client_options())
    assert info["client"] == {
        "client": client,
        "reason": "S3 with static keys" if client == "engine" else "client='obstore'",
    }


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_virtual_hosted_bucket_behind_an_endpoint_is_read(served, client: str) -> None:
    """The endpoint is the bucket's own host (MinIO, R2, Ceph): nothing is added to its name or its path."""
    data, serve = served
    server = serve()
    # (obstore keeps a trailing slash of such an endpoint, and asks for //key: the engine does not)
    options = {"endpoint": server.url_for("").rstrip("/"), "region": "us-east-1", "anonymous": True}
    check_pass(f"s3://bkt/{GROUP}", data, client=client, virtual_hosted_style_request=True, **options)
    assert _chunk_gets(server) > 0
    assert all(
        r.path.startswith(f"/{GROUP}/") and r.headers["host"] == f"127.0.0.1:{server.port}" for r in server.requests
    )


def _wrong_range(request: Request) -> bytes | None:
    if "/s/c/" not in request.path or "range" not in request.headers:
        return None
    return answer(206, b"\0" * 8, Content_Range="bytes 1000-1007/99999")  # the sharded array's ranged reads


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_wrong_range_is_a_store_read_error_naming_key_and_ranges(served, client: str) -> None:
    data, serve = served
    server = serve(_wrong_range)
    store = obstore_store(server.url_for(GROUP), read_only=True, client=client, retry={"max_retries": 1})
    try:
        manifest = split_by_chunk(open_geometries(store)["v"], fractions=(0.75, 0.25))
        with (
            InSituDataset(store, manifest, batch_size=BATCH_SIZE, block_chunks=2, shuffle=False) as ds,
            pytest.raises(StoreReadError) as info,
        ):
            for batch in ds.train:
                assert_batch_matches(batch, ds.variables, data)
    finally:
        close_store(store)
    text = str(info.value)
    assert "array 's'" in text and "key 's/c/" in text and "gave up" in text
    if client == "engine":
        assert "asked bytes=" in text and "'bytes 1000-1007/99999'" in text
    else:
        assert "Requested" in text and "got 1000..1008" in text
