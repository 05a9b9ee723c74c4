"""Stores only obstore can read, through the public API: an S3 credential provider, and a forward proxy.

Each reads a real zarr group (written by zarr-python) in one whole pass of
``InSituDataset`` and compares every batch with zarr's own read; ``describe()``
says obstore's client read it, and why.
"""

from __future__ import annotations

import http.client
import os
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import zarr
from helpers import assert_batch_matches, write_tiled_and_sharded
from servers import S3_KEY_ID, S3_REGION, S3_SECRET

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator, Request

if TYPE_CHECKING:
    from servers import HTTPFileServer, S3Server

SHAPE = (24, 6, 8)


@pytest.fixture(autouse=True)
def _no_machine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # no proxy, AWS or client variable of the machine changes what these stores do
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT":
            monkeypatch.delenv(name)


def _whole_pass(store: zarr.abc.store.Store, data: dict[str, np.ndarray]) -> dict[str, Any]:
    """Every batch of the train split equals zarr's read; returns ``describe()``."""
    manifest = split_by_chunk(open_geometries(store)["v"], fractions=(0.75, 0.25))
    with InSituDataset(store, manifest, batch_size=5, block_chunks=2) as ds:
        batches = 0
        for batch in ds.split("train"):
            assert_batch_matches(batch, ds.variables, data)
            batches += 1
        assert batches == len(ds.split("train")) > 0
        return ds.describe()


def test_s3_signed_by_a_credential_provider_reads_equal_to_zarr(s3_server: S3Server, s3_bucket: str) -> None:
    writer = obstore_store(f"s3://{s3_bucket}/g.zarr", **s3_server.client_options())
    data = write_tiled_and_sharded(writer, SHAPE, 5)
    close_store(writer)
    calls = []

    def provider() -> dict[str, Any]:
        calls.append(1)
        return {"access_key_id": S3_KEY_ID, "secret_access_key": S3_SECRET, "token": None, "expires_at": None}

    store = obstore_store(
        f"s3://{s3_bucket}/g.zarr",
        read_only=True,
        endpoint=s3_server.endpoint,
        region=S3_REGION,
        credential_provider=provider,
    )
    try:
        info = _whole_pass(store, data)
    finally:
        close_store(store)
    assert calls, "the credential provider signed nothing"
    assert info["client"] == {
        "client": "obstore",
        "reason": "credential_provider is set: obstore's credential provider signs",
    }


# Hop-by-hop and per-server headers a proxy does not pass on.
_NOT_FORWARDED = ("connection", "transfer-encoding", "keep-alive", "server", "date")


def _forward(request: Request) -> bytes:
    """A plain-HTTP forward proxy's answer: the request for ``http://host/path`` sent on, the answer back."""
    target = urllib.parse.urlsplit(request.target)  # a proxy is asked for the absolute URL
    upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
    headers = {k: v for k, v in request.headers.items() if k not in ("proxy-connection", "host")}
    try:
        upstream.request(request.method, target.path or "/", headers=headers)
        got = upstream.getresponse()
        body = got.read()
    finally:
        upstream.close()
    lines = [f"HTTP/1.1 {got.status} {got.reason}"]
    lines += [f"{name}: {value}" for name, value in got.getheaders() if name.lower() not in _NOT_FORWARDED]
    if got.getheader("Content-Length") is None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if request.method == "HEAD" else head + body


@pytest.fixture
def forward_proxy() -> Iterator[Emulator]:
    """The emulator as a forward proxy on loopback: every request it passes on is in its ``requests``."""
    with Emulator(None, latency_s=0.0, jitter_s=0.0, script=_forward, record=True) as proxy:
        yield proxy


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy"])
def test_a_store_behind_a_proxy_reads_equal_to_zarr_every_request_through_it(
    http_server: HTTPFileServer,
    forward_proxy: Emulator,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
) -> None:
    data = write_tiled_and_sharded(zarr.storage.LocalStore(http_server.root / "g.zarr"), SHAPE, 5)
    monkeypatch.setenv(variable, forward_proxy.url)
    store = obstore_store(f"{http_server.url}/g.zarr", read_only=True)
    try:
        info = _whole_pass(store, data)
    finally:
        close_store(store)
    assert info["client"] == {"client": "obstore", "reason": f"{variable} is set in the environment (a proxy)"}
    served = [(method, path) for method, path, _ in http_server.requests]
    assert len(served) > 0
    # every request the file server answered came through the proxy: the engine's client did not go around it
    assert sorted(urllib.parse.urlsplit(r.target).path for r in forward_proxy.requests) == sorted(p for _, p in served)
