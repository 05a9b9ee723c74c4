"""A store carries its reader: route, read policy, endpoint and the reader itself travel with the store object.

Every store ``obstore_store`` builds holds its reader (built once, held
until it closes); any other store is adapted once, at the dataset's door,
into a ``StoreAdapter`` that delegates everything and carries a reader of
its own, which the dataset closes (never the user's store).
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import obstore.store
import pytest
import zarr
from helpers import assert_batch_matches, smooth_field, sockets_to, write_array
from zarr.errors import ZarrUserWarning
from zarr.storage import ObjectStore

from insitubatch._engine.reads.store_link import client_for
from insitubatch._wire.backends import ObstoreBackend
from insitubatch._wire.engine_client import NativeBackend
from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.local_files import LocalFiles
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.reading import LOCAL_ROUTE, StoreAdapter, reading_store

if TYPE_CHECKING:
    from conftest import HTTPFileServer

URL = "http://127.0.0.1:9/ds.zarr"  # nothing listens: building a store or its reader sends no request
SHAPE = (24, 6, 8)
# how long the sockets of a closed pool may take to leave /proc (closed on the loop a moment later)
SETTLE_S = 5.0


@pytest.fixture(autouse=True)
def _no_machine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT" or name.startswith("AWS_"):
            monkeypatch.delenv(name)


def _write_group(root: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    store = zarr.storage.LocalStore(root)
    group = zarr.open_group(store, mode="w")
    write_array(group, "v", smooth_field(rng, SHAPE), (4, 3, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(store)
    return {"v": zarr.open_group(store, mode="r")["v"][...]}


def _settled_sockets(port: int) -> int:
    deadline = time.monotonic() + SETTLE_S
    while sockets_to(port) and time.monotonic() < deadline:
        time.sleep(0.02)
    return sockets_to(port)


def test_an_obstore_store_carries_its_route_policy_endpoint_and_retry_free_twin() -> None:
    store = obstore_store(URL, retry={"max_retries": 3}, client_options={"read_timeout": "7s"})
    try:
        assert (store.route.client, store.route.reason) == ("engine", "an http store")
        assert store.policy.max_retries == 3 and store.policy.read_timeout_s == 7.0
        assert store.endpoint == "http:http://127.0.0.1:9"
        # the twin was built by the factory from the same arguments, with obstore's retries off
        assert store.twin is not store.store and store.twin.url == store.store.url
        assert store.twin.client_options == store.store.client_options
        assert store.twin.retry_config["max_retries"] == 0
        assert store.twin.retry_config["retry_timeout"] == timedelta(0)
        assert store.store.retry_config["max_retries"] == 3
        reader = store.reader()
        assert isinstance(reader.backend, NativeBackend) and reader.backend.raw is store.twin
        assert store.reader() is reader  # built once, held by the store
        assert reader.policy == store.policy and reader.endpoint == store.endpoint
    finally:
        store.close()


def test_obstores_client_reads_through_the_twin_and_says_why() -> None:
    with obstore_store(URL, client="obstore") as store:
        backend = store.reader().backend
        assert type(backend) is ObstoreBackend and backend.raw is store.twin and not backend.own_retries
        assert (store.route.client, store.route.reason) == ("obstore", "client='obstore'")


def test_a_local_store_says_it_reads_the_files_under_its_root(tmp_path: Path) -> None:
    with obstore_store(tmp_path) as store:
        files = store.local_reader()
        assert isinstance(files, LocalFiles) and files.root == str(tmp_path)
        assert store.route == LOCAL_ROUTE and store.endpoint is None


def test_stores_on_one_endpoint_share_a_link_and_each_carries_its_own_reader() -> None:
    first, second = obstore_store(URL), obstore_store("http://127.0.0.1:9/other.zarr")
    try:
        a, b = client_for(first), client_for(second)
        assert a.link is b.link  # one window, latency and hedge budget per endpoint
        assert a.backend is first.reader().backend and b.backend is second.reader().backend
        assert a.backend is not b.backend
    finally:
        first.close()
        second.close()


def test_a_store_of_ours_is_not_adapted_and_any_other_store_is(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = obstore_store(URL)
    assert reading_store(ours) is ours
    theirs = ObjectStore(obstore.store.HTTPStore.from_url(URL, client_options={"allow_http": True}))
    adapter = reading_store(theirs)
    assert isinstance(adapter, StoreAdapter) and adapter.adapted is theirs
    assert adapter.reader().route.client == "engine"  # behind zarr's ObjectStore: obstore's store, read directly
    closed: list[str] = []
    monkeypatch.setattr(theirs, "close", lambda: closed.append("theirs"))
    adapter.close()
    assert closed == []  # the adapter closes its reader, never the store it adapts
    ours.close()


def _read_on_a_loop(backend: NativeBackend, keys: list[str], loop: asyncio.AbstractEventLoop) -> list[bytes]:
    """Each key's bytes through ``backend`` on ``loop`` (running in another thread: its connections stay open)."""

    async def main() -> list[bytes]:
        return [bytes(b) for b in await asyncio.gather(*(backend.request(k) for k in keys))]

    return asyncio.run_coroutine_threadsafe(main(), loop).result(20)


def test_leaving_with_closes_the_engines_connections(http_server: HTTPFileServer) -> None:
    (http_server.root / "d").mkdir()
    bodies = [bytes([i]) * (1000 + i) for i in range(4)]
    for i, body in enumerate(bodies):
        (http_server.root / "d" / f"k{i}").write_bytes(body)
    port = int(http_server.url.rsplit(":", 1)[1])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with obstore_store(f"{http_server.url}/d", read_only=True, client="engine") as store:
            backend = store.reader().backend
            assert _read_on_a_loop(backend, [f"k{i}" for i in range(4)], loop) == bodies
            assert sockets_to(port) >= 1 and backend.pool.idle >= 1
        assert not store._is_open
        assert _settled_sockets(port) == 0 and backend.pool.idle == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_store_nobody_holds_closes_the_engines_connections_when_it_is_collected(
    http_server: HTTPFileServer,
) -> None:
    (http_server.root / "d").mkdir()
    (http_server.root / "d" / "k").write_bytes(b"x" * 1000)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        store = obstore_store(f"{http_server.url}/d", read_only=True, client="engine")
        backend = store.reader().backend
        assert _read_on_a_loop(backend, ["k"], loop) == [b"x" * 1000] and backend.pool.idle == 1
        del store  # no table holds the store or its reader: collecting the store closes what its reader opened
        gc.collect()
        assert backend.pool.idle == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_plain_zarr_object_store_is_adapted_once_reads_equal_to_zarr_and_stays_open(
    http_server: HTTPFileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _write_group(http_server.root / "g.zarr")
    user = ObjectStore(
        obstore.store.HTTPStore.from_url(f"{http_server.url}/g.zarr", client_options={"allow_http": True})
    )
    manifest = split_by_chunk(open_geometries(user)["v"], fractions=(0.75, 0.25))
    closed: list[str] = []
    monkeypatch.setattr(user, "close", lambda: closed.append("user"))
    with InSituDataset(user, manifest, batch_size=5, block_chunks=2, shuffle=False) as ds:
        adapter = ds.context.store
        assert isinstance(adapter, StoreAdapter) and adapter.adapted is user and ds.store is user
        backend = adapter.reader().backend
        assert isinstance(backend, NativeBackend)
        for split in ("train", "val"):
            for batch in ds.split(split):
                assert_batch_matches(batch, ds.variables, data)
            assert ds.context.store is adapter and ds.context.client().backend is backend  # one adapter, one reader
        assert ds.describe()["client"] == {"client": "engine", "reason": "an http store"}
        assert backend.pool.idle >= 1
    # closing the dataset closed the adapter's reader (the engine's connections), never the user's store
    assert backend.pool.idle == 0
    assert adapter.reader().backend is not backend  # (a later read would open afresh)
    adapter.close()
    assert closed == []
    np.testing.assert_array_equal(zarr.open_group(user, mode="r")["v"][...], data["v"])
