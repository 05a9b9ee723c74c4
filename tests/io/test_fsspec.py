"""fsspec stores through the engine: local, memory, HTTP and S3 filesystems read like zarr, each chunk once.

The HTTP filesystem (fsspec's, on aiohttp) reads from the loopback emulator,
whose own counters are the ground truth for GETs; ``close_store`` closes its
aiohttp session, and no socket of this process to the emulator stays open.
s3fs reads from moto's S3 server; ``close_store`` closes its aiobotocore
client the same way.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from helpers import CountingStore, open_fds

from insitubatch import InSituDataset, close_store, fsspec_store, open_geometries, split_by_chunk

pytest.importorskip("fsspec")

SHAPE = (40, 6, 10)
CHUNKS = (4, 3, 10)  # 10 x 2 stored chunks
N_CHUNKS = 20
DIMS = ("time", "y", "x")
# /proc/net/tcp's state column for an established connection
TCP_ESTABLISHED = "01"
# How long the emulator's handler threads may take to close their ends after the client closed (a loaded box)
SERVER_CLOSE_S = 10.0
POLL_S = 0.05


def _write(store: Any) -> np.ndarray:
    data = np.random.default_rng(0).random(SHAPE, dtype="f4")
    root = zarr.open_group(store, mode="w", zarr_format=3)
    root.create_array("t", shape=SHAPE, chunks=CHUNKS, dtype="f4", dimension_names=DIMS)[...] = data
    return data


def _pass(store: Any) -> tuple[np.ndarray, Any]:
    """The rows of one sequential pass over ``t`` (named: an HTTP filesystem cannot list), and its counters."""
    geoms = open_geometries(store, variables=["t"])
    manifest = split_by_chunk(geoms["t"], fractions=(1.0,))
    with InSituDataset(store, manifest, {"t": geoms["t"]}, batch_size=7, shuffle=False, hedge=False) as ds:
        rows = np.concatenate([b.arrays["t"] for b in ds.split("train")])
        return rows, ds.split("train").last_pass


@pytest.fixture(params=["local", "memory"])
def listed(request, tmp_path: Path) -> tuple[str, np.ndarray]:
    """``(url, data)`` of a group written through fsspec itself."""
    if request.param == "local":
        url = str(tmp_path / "f.zarr")
    else:
        url = f"memory://insitubatch-tests/{uuid.uuid4().hex}"
    writer = fsspec_store(url)
    data = _write(writer)
    close_store(writer)
    return url, data


def test_a_pass_over_a_local_or_memory_filesystem_equals_zarr(listed: tuple[str, np.ndarray]) -> None:
    url, data = listed
    store = CountingStore(fsspec_store(url, read_only=True))
    rows, counters = _pass(store)
    np.testing.assert_array_equal(rows, zarr.open_array(fsspec_store(url, read_only=True), path="t", mode="r")[...])
    np.testing.assert_array_equal(rows, data)
    chunks = store.chunk_gets()
    assert len(chunks) == N_CHUNKS == counters.gets and set(chunks.values()) == {1}


def _sockets_to(port: int) -> int:
    """Established TCP connections of this process whose far end is ``127.0.0.1:port``."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:[") : -1])
    count = 0
    with open("/proc/self/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if remote_port == port and fields[3] == TCP_ESTABLISHED and fields[9] in mine:
                count += 1
    return count


def test_an_http_filesystem_reads_each_chunk_once_and_closes_its_session(emulator) -> None:
    pytest.importorskip("aiohttp")  # fsspec's HTTP filesystem runs on it (the dev extra installs it)
    data = _write(zarr.storage.LocalStore(emulator.root / "h.zarr"))
    fds = open_fds()
    store = fsspec_store(emulator.url_for("h.zarr"), read_only=True)
    emulator.reset_stats()
    rows, counters = _pass(store)
    np.testing.assert_array_equal(rows, data)
    served = {k: v.gets for k, v in emulator.stats().keys.items() if "/t/c/" in k}
    assert len(served) == N_CHUNKS == counters.gets and set(served.values()) == {1}  # the server's own count

    session = store.fs._session
    assert session is not None and not session.closed and _sockets_to(emulator.port) > 0
    close_store(store)
    assert session.closed
    assert _sockets_to(emulator.port) == 0
    # nothing of the session's is left open (the server's ends of the connections close on its own threads)
    deadline = time.monotonic() + SERVER_CLOSE_S
    while open_fds() > fds and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert open_fds() <= fds
    close_store(store)  # a second close does nothing more


def test_each_store_owns_its_filesystem(emulator) -> None:
    pytest.importorskip("aiohttp")
    data = _write(zarr.storage.LocalStore(emulator.root / "h.zarr"))
    first = fsspec_store(emulator.url_for("h.zarr"), read_only=True)
    second = fsspec_store(emulator.url_for("h.zarr"), read_only=True)
    assert first.fs is not second.fs  # fsspec's instance cache would share one session between them
    np.testing.assert_array_equal(zarr.open_array(first, path="t", mode="r")[...], data)
    np.testing.assert_array_equal(zarr.open_array(second, path="t", mode="r")[...], data)
    close_store(first)
    np.testing.assert_array_equal(zarr.open_array(second, path="t", mode="r")[...], data)  # still open
    close_store(second)
    assert _sockets_to(emulator.port) == 0


def test_an_s3fs_filesystem_against_the_s3_server_equals_zarr_and_closes_its_client(s3_server, s3_bucket) -> None:
    """s3fs (aiobotocore) over moto's S3 server: the pass equals zarr's read, each chunk is one GET, and
    ``close_store`` closes the filesystem's client (no socket of it stays open)."""
    pytest.importorskip("s3fs")  # the dev extra installs it
    from servers import S3_KEY_ID, S3_REGION, S3_SECRET

    options = {
        "key": S3_KEY_ID,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": s3_server.endpoint, "region_name": S3_REGION},
    }
    url = f"s3://{s3_bucket}/f.zarr"
    writer = fsspec_store(url, **options)
    data = _write(writer)
    close_store(writer)
    port = int(s3_server.endpoint.rsplit(":", 1)[1])
    fds = open_fds()
    inner = fsspec_store(url, read_only=True, **options)
    store = CountingStore(inner)
    rows, counters = _pass(store)
    np.testing.assert_array_equal(rows, data)
    chunks = store.chunk_gets()
    assert len(chunks) == N_CHUNKS == counters.gets and set(chunks.values()) == {1}
    np.testing.assert_array_equal(rows, zarr.open_array(inner, path="t", mode="r")[...])
    client = inner.fs.s3
    http = client._endpoint.http_session  # aiobotocore's, holding the aiohttp sessions and their connections
    opened = list(http._sessions.values())
    assert opened and not any(session.closed for session in opened)
    close_store(inner)
    assert http._sessions is None and all(session.closed for session in opened)
    assert _sockets_to(port) == 0
    deadline = time.monotonic() + SERVER_CLOSE_S
    while open_fds() > fds and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert open_fds() <= fds
    close_store(inner)  # a second close does nothing more
    again, _ = _pass(CountingStore(inner))  # a read after the close: a fresh client, the same rows
    np.testing.assert_array_equal(again, data)
    assert inner.fs.s3 is not client
    close_store(inner)
    assert _sockets_to(port) == 0
