"""A store the user wraps (zarr's ``LoggingStore`` around an HTTP store) reads through the wrapper, never silently.

The wrapper must see every read (its logging is why it is there), so the
engine reads through its ``get``; ``describe()`` names the wrapper, and the
GETs the server answers are the ones the plain store's pass sends.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import zarr
from helpers import assert_batch_matches, write_tiled_and_sharded
from zarr.storage import LoggingStore, WrapperStore

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store

if TYPE_CHECKING:
    from servers import HTTPFileServer

SHAPE = (24, 6, 8)


@pytest.fixture(autouse=True)
def _no_machine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT":
            monkeypatch.delenv(name)


def _pass_gets(server: HTTPFileServer, store: zarr.abc.store.Store, data: dict[str, np.ndarray]) -> tuple[Any, list]:
    """One whole train pass checked against zarr; ``(describe()['client'], the chunk GETs the server answered)``."""
    manifest = split_by_chunk(open_geometries(store)["v"], fractions=(0.75, 0.25))
    del server.requests[:]
    with InSituDataset(store, manifest, batch_size=5, block_chunks=2, shuffle=False) as ds:
        for batch in ds.split("train"):
            assert_batch_matches(batch, ds.variables, data)
        client = ds.describe()["client"]
    gets = sorted((path, _whole_if_open_ended(rng)) for method, path, rng in server.requests if method == "GET")
    return client, gets


def _whole_if_open_ended(byte_range: str | None) -> str:
    """The engine asks for a whole key as ``bytes=0-<far past any object>``, zarr with no range: one GET either way."""
    if byte_range is None or (byte_range.startswith("bytes=0-") and int(byte_range[8:] or 0) >= 2**40):
        return "whole"
    return byte_range


def test_a_logging_store_reads_through_its_get_with_the_plain_stores_gets(
    http_server: HTTPFileServer, caplog: pytest.LogCaptureFixture
) -> None:
    data = write_tiled_and_sharded(zarr.storage.LocalStore(http_server.root / "g.zarr"), SHAPE, 9)
    url = f"{http_server.url}/g.zarr"
    plain = obstore_store(url, read_only=True)
    inner = obstore_store(url, read_only=True)
    wrapped = LoggingStore(inner, log_level="INFO")
    try:
        plain_client, plain_gets = _pass_gets(http_server, plain, data)
        with caplog.at_level(logging.INFO):
            wrapped_client, wrapped_gets = _pass_gets(http_server, wrapped, data)
    finally:
        close_store(plain)
        close_store(inner)
    assert plain_client["client"] == "engine"
    assert wrapped_client["client"] == "store" and "LoggingStore" in wrapped_client["reason"]
    assert len(wrapped_gets) == len(plain_gets) > 0
    assert wrapped_gets == plain_gets
    assert any("get" in record.getMessage().lower() and "/c/" in record.getMessage() for record in caplog.records)


class _Tagged(WrapperStore):
    """A user's wrapper that adds a label and defines no read: every read passes on to the store inside."""

    label = "era5"


def test_a_wrapper_that_defines_no_read_keeps_the_engines_path(http_server: HTTPFileServer) -> None:
    data = write_tiled_and_sharded(zarr.storage.LocalStore(http_server.root / "g.zarr"), SHAPE, 9)
    url = f"{http_server.url}/g.zarr"
    plain = obstore_store(url, read_only=True)
    inner = obstore_store(url, read_only=True)
    tagged = _Tagged(_Tagged(inner))  # a stack of them, too
    try:
        plain_client, plain_gets = _pass_gets(http_server, plain, data)
        tagged_client, tagged_gets = _pass_gets(http_server, tagged, data)
    finally:
        close_store(plain)
        close_store(tagged)
        close_store(inner)
    assert tagged_client == plain_client == {"client": "engine", "reason": "an http store"}
    assert tagged_gets == plain_gets and len(plain_gets) > 0
