"""Shared fixtures: loopback servers and dataset writers."""

from __future__ import annotations

import gc
import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from servers import HTTPFileServer, S3Server, serve_files, start_s3_server

if TYPE_CHECKING:
    import zarr.storage

_bucket_ids = itertools.count()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Set what collection left alive (the frameworks the test modules import, the modules, the items) aside from
    the cyclic collector: it lives as long as the session. A test's ``gc.collect()`` (run to finalize what the test
    dropped) then scans what the tests made since, not the half a million objects torch, JAX and Lightning bring,
    which cost about 0.5 s a call and made a test that collects once a round four times slower in the suite."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    """One moto S3 server for the whole session, on 127.0.0.1 and a free port."""
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server; returns its name."""
    name = f"bucket-{next(_bucket_ids)}"
    s3_server.create_bucket(name)
    return name


# --- the emulator serving a directory (stores tests) -----------------------------


@pytest.fixture
def http_server(tmp_path: Path) -> HTTPFileServer:
    """The emulator serving a fresh directory (``.root``) at ``.url``, no latency; ``.requests`` notes each request."""
    root = (tmp_path / "http-root").resolve()
    root.mkdir()
    with serve_files(root) as server:
        yield server


# --- parallel-write tests ------------------------------------------------------


@pytest.fixture
def write_s3_store(s3_server: S3Server, s3_bucket: str) -> zarr.storage.ObjectStore:
    """A writable zarr ``ObjectStore`` over a fresh bucket of the loopback S3 server (picklable)."""
    import zarr.storage
    from obstore.store import S3Store

    options = s3_server.client_options()
    raw = S3Store(
        s3_bucket,
        endpoint=options["endpoint"],
        access_key_id=options["access_key_id"],
        secret_access_key=options["secret_access_key"],
        region=options["region"],
        client_options={"allow_http": options["allow_http"]},
    )
    return zarr.storage.ObjectStore(raw)


# --- the benchmark's loopback object store, with fault injection ------------------


@pytest.fixture
def emulator(tmp_path: Path):
    """``insitubatch.testing.emulator.Emulator`` over a fresh directory (``.root``) on 127.0.0.1, no added latency.

    The same server the benchmarks measure against: write a zarr under
    ``.root``, read it at ``.url_for(name)``, and ``.inject(kind, key_glob, ...)``
    faults (500/503/403/404, retry-after, reset, truncate, stall).
    """
    from insitubatch.testing.emulator import Emulator

    root = tmp_path / "emulator-root"
    root.mkdir()
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        yield emu
