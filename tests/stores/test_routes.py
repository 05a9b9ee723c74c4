"""Every store factory's store says which backend reads it and why: ``describe()`` and ``inspect`` show it.

For each kind of store (obstore over HTTP, over S3 and on a local path,
fsspec, icechunk, and zarr's own stores adapted at the dataset's door) a
real group written by zarr-python is read in one whole pass, every batch
compared with zarr's own read, and ``describe()["client"]`` and the
``client`` line of ``inspect_store`` must name the backend and the reason
the store itself gives.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import zarr
import zarr.storage
from helpers import assert_batch_matches, smooth_field
from zarr.errors import ZarrUserWarning

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.fsspec_stores import fsspec_store
from insitubatch.stores.icechunk_stores import ICECHUNK_READ, InSituIcechunkStore, icechunk_store
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.reading import LOCAL_ROUTE
from insitubatch.tools.inspect_store import inspect_store

if TYPE_CHECKING:
    from servers import HTTPFileServer, S3Server

SHAPE = (16, 6, 8)
FSSPEC_READ = "an fsspec store: read through its own get, which retries by fsspec's rules"


@pytest.fixture(autouse=True)
def _no_machine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # no proxy, AWS or client variable of the machine changes which client reads a store
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT":
            monkeypatch.delenv(name)


def _write(store: Any, *, consolidate: bool = True) -> np.ndarray:
    """A group at ``store`` with one array ``v`` (time x lat x lon, 4 x 3 x 8 chunks); its values, read back by zarr.

    Consolidated (an HTTP endpoint cannot list), except where the store keeps no consolidated metadata (icechunk).
    """
    group = zarr.open_group(store, mode="w")
    array = group.create_array("v", shape=SHAPE, chunks=(4, 3, 8), dtype="f4", dimension_names=("time", "lat", "lon"))
    array[...] = smooth_field(np.random.default_rng(5), SHAPE)
    if consolidate:
        with warnings.catch_warnings():  # zarr: consolidated metadata is not in the v3 spec yet
            warnings.simplefilter("ignore", ZarrUserWarning)
            zarr.consolidate_metadata(group.store)
    return zarr.open_array(store, path="v", mode="r")[...]


def _read(store: Any, data: np.ndarray) -> dict[str, str]:
    """One whole pass of the train split, every batch equal to zarr's read; ``describe()["client"]``."""
    manifest = split_by_chunk(open_geometries(store, variables=["v"])["v"], fractions=(0.75, 0.25))
    with InSituDataset(store, manifest, batch_size=4, block_chunks=2) as ds:
        batches = 0
        for batch in ds.split("train"):
            assert_batch_matches(batch, ds.variables, {"v": data})
            batches += 1
        assert batches == len(ds.split("train")) > 0
        return ds.describe()["client"]


def _inspected(store: Any) -> str:
    """The ``client`` line ``inspect_store`` prints for ``store``."""
    text = inspect_store(store, variables=["v"], probe=False)
    return next(line for line in text.splitlines() if line.startswith("client "))


def _check(store: Any, data: np.ndarray, client: str, reason: str) -> None:
    assert _read(store, data) == {"client": client, "reason": reason}
    assert _inspected(store).split(None, 1)[1] == f"{client}: {reason}"


def test_an_obstore_http_store_is_read_by_the_engines_client(http_server: HTTPFileServer) -> None:
    data = _write(http_server.root / "g.zarr")
    with obstore_store(f"{http_server.url}/g.zarr", read_only=True) as store:
        _check(store, data, "engine", "an http store")
    with obstore_store(f"{http_server.url}/g.zarr", read_only=True, client="obstore") as store:
        _check(store, data, "obstore", "client='obstore'")


def test_an_obstore_s3_store_is_read_by_the_engines_client_with_its_static_keys(
    s3_server: S3Server, s3_bucket: str
) -> None:
    url = f"s3://{s3_bucket}/g.zarr"
    with obstore_store(url, **s3_server.client_options()) as writer:
        data = _write(writer)
    with obstore_store(url, read_only=True, **s3_server.client_options()) as store:
        _check(store, data, "engine", "S3 with static keys")


def test_an_obstore_store_on_a_local_path_is_read_from_the_files(tmp_path: Path) -> None:
    data = _write(tmp_path / "g.zarr")
    with obstore_store(tmp_path / "g.zarr", read_only=True) as store:
        _check(store, data, LOCAL_ROUTE.client, LOCAL_ROUTE.reason)


def test_an_fsspec_store_is_read_through_its_own_get(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    data = _write(tmp_path / "g.zarr")
    with fsspec_store(f"file://{tmp_path / 'g.zarr'}", read_only=True) as store:
        _check(store, data, "store", FSSPEC_READ)


def test_an_icechunk_store_is_ours_and_read_through_icechunks_own_get(tmp_path: Path) -> None:
    pytest.importorskip("icechunk")
    writer = icechunk_store(tmp_path / "repo", read_only=False)
    data = _write(writer, consolidate=False)
    writer.session.commit("the group")
    with icechunk_store(tmp_path / "repo") as store:
        assert isinstance(store, InSituIcechunkStore)
        _check(store, data, "store", ICECHUNK_READ)
        # wrapped in a zarr wrapper that passes every read on, it still reads (and says so) as it carries
        _check(zarr.storage.WrapperStore(store), data, "store", ICECHUNK_READ)


def test_zarrs_own_stores_are_adapted_at_the_door_and_say_how_they_are_read(
    tmp_path: Path, http_server: HTTPFileServer
) -> None:
    import obstore.store

    data = _write(tmp_path / "g.zarr")
    # zarr's LocalStore reads on the calling thread: its own get_sync, no HTTP client
    _check(zarr.storage.LocalStore(tmp_path / "g.zarr", read_only=True), data, LOCAL_ROUTE.client, LOCAL_ROUTE.reason)
    # zarr's plain ObjectStore over obstore's HTTP store: the engine reads the obstore store behind it
    _write(http_server.root / "g.zarr")
    raw = obstore.store.HTTPStore.from_url(f"{http_server.url}/g.zarr", client_options={"allow_http": True})
    _check(zarr.storage.ObjectStore(raw, read_only=True), data, "engine", "an http store")
    # a subclass the engine cannot see past is read through its own get, and the reason names it
    logging = zarr.storage.LoggingStore(zarr.storage.LocalStore(tmp_path / "g.zarr", read_only=True))
    route = _read(logging, data)
    if "get_sync" in vars(zarr.storage.LoggingStore):  # zarr >= 3.4: it logs its reads on the calling thread too
        assert (route["client"], route["reason"]) == (LOCAL_ROUTE.client, LOCAL_ROUTE.reason)
    else:
        assert route["client"] == "store" and "LoggingStore" in route["reason"]
