"""Connections over time, through each client: idle ones expire, new ones time out, and closing a store closes them.

The last test opens, iterates and closes 20 remote datasets in one process
and counts descriptors (``/proc/self/fd``) and the connections the server
holds: nothing may grow.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time
from pathlib import Path

import obstore.store
import pytest
from datasets import BATCH_SIZE, GROUP, manifest_of, write_group
from helpers import assert_batch_matches, sockets_to
from scripted import WIRE_CLIENTS, read_through
from zarr.abc.store import RangeByteRequest

from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.store_link import client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch._wire.engine_client import NativeBackend
from insitubatch.dataset import InSituDataset
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.stores.wire_settings import OBSTORE_POOL_IDLE_TIMEOUT_S, engine_settings
from insitubatch.testing.emulator import Emulator, ranged

BODY = bytes(range(256)) * 16


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_an_idle_connection_is_closed_after_pool_idle_timeout(scripted, client: str) -> None:
    server = scripted(lambda r: ranged(BODY, "bytes=0-9"))  # the connection kept: the client closes it when idle

    def idle_for() -> list[float]:
        """How long each closed connection sat idle after its last answer before the client closed it."""
        return [c.closed_s - c.answered_s for c in server.connections if c.closed_s and c.answered_s]

    store = obstore_store(
        server.url_for("ds"), read_only=True, client=client, client_options={"pool_idle_timeout": "1s"}
    )
    reader = client_for(store)
    fetcher = Fetcher(reader, ReadWindow(2).user(2), PassCounters(), hedge=False)

    async def read_then_wait() -> bytes:
        got = await fetcher.get("k", RangeByteRequest(0, 10))
        for _ in range(40):  # the loop keeps running, as zarr's does between passes
            if idle_for():
                break
            await asyncio.sleep(0.1)
        return got.to_bytes()

    assert asyncio.run(read_then_wait()) == BODY[:10]
    idle = idle_for()
    assert idle and 0.7 < idle[0] < 3.0, idle
    close_store(store)


def test_idle_and_connect_timeouts_default_to_obstores() -> None:
    plain = engine_settings(obstore.store.HTTPStore.from_url("https://h.test/x"))
    assert not isinstance(plain, str)
    assert (plain.pool_idle_timeout_s, plain.connect_timeout_s) == (OBSTORE_POOL_IDLE_TIMEOUT_S, 5.0) == (90.0, 5.0)
    options = {"pool_idle_timeout": "2min 30s", "connect_timeout": "250ms", "pool_max_idle_per_host": "3"}
    tuned = engine_settings(obstore.store.HTTPStore.from_url("https://h.test/x", client_options=options))
    assert not isinstance(tuned, str)
    assert (tuned.pool_idle_timeout_s, tuned.connect_timeout_s, tuned.max_idle) == (150.0, 0.25, 3)
    backend = NativeBackend(None, tuned)
    assert (backend.pool.idle_timeout_s, backend.pool.connect_timeout_s, backend.pool.max_idle) == (150.0, 0.25, 3)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_connection_that_never_completes_times_out_at_connect_timeout(client: str) -> None:
    """A server that accepts TCP and never speaks TLS: each attempt ends at ``connect_timeout``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/ds"
        t0 = time.monotonic()
        got = read_through(client, url, "k", RangeByteRequest(0, 4), client_options={"connect_timeout": "1s"})
        elapsed = time.monotonic() - t0
        assert isinstance(got, Exception), got
        assert len(held) == 3 and elapsed < 3 * 1.0 + 3.0  # three attempts, each cut at 1 s
        if client == "engine":
            assert "took over 1s" in str(got)
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def test_close_store_closes_the_engines_connections_and_a_later_read_reopens(tmp_path: Path, scripted) -> None:
    (tmp_path / "ds").mkdir()
    for i in range(6):
        (tmp_path / "ds" / f"k{i}").write_bytes(BODY)
    server = scripted(root=tmp_path)
    store = obstore_store(server.url_for("ds"), read_only=True, client="engine")
    reader = client_for(store)
    fetcher = Fetcher(reader, ReadWindow(6).user(6), PassCounters(), hedge=False)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def read_all() -> list[bytes]:
        async def main() -> list:
            return await asyncio.gather(*(fetcher.get(f"k{i}") for i in range(6)))

        return [b.to_bytes() for b in asyncio.run_coroutine_threadsafe(main(), loop).result(20)]

    try:
        assert read_all() == [BODY] * 6
        assert sockets_to(server.port) == 6
        close_store(store)  # the store stays alive (we hold it): its client's connections close all the same
        assert sockets_to(server.port) == 0
        deadline = time.monotonic() + 5  # the server's own thread sees each connection end a moment later
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.open_connections == 0
        fresh = client_for(store)
        assert fresh is not reader  # a later read builds a fresh client
        fetcher = Fetcher(fresh, ReadWindow(6).user(6), PassCounters(), hedge=False)
        assert read_all() == [BODY] * 6
    finally:
        close_store(store)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# Sockets close a moment after their owner lets go (obstore's on its runtime's threads, the engine's on zarr's loop):
# a round's counts are taken once they have settled, or after this long.
SETTLE_S = 5.0


def _settled(server: Emulator, most: tuple[int, int] | None) -> tuple[int, int]:
    """``(descriptors, connections the server holds)`` once within ``most`` (or after ``SETTLE_S``)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        gc.collect()
        counts = (_open_descriptors(), server.open_connections)
        if (most is None and counts[1] == 0) or (most is not None and counts <= most):
            return counts
        if time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_twenty_datasets_opened_iterated_and_closed_leave_nothing_open(
    tmp_path: Path, monkeypatch, client, scripted
) -> None:
    data = write_group(tmp_path)
    server = scripted(root=tmp_path)
    monkeypatch.setenv("INSITUBATCH_CLIENT", client)  # the datasets open the URL themselves: the process default
    url = server.url_for(GROUP)
    manifest = manifest_of(url)
    counts = []
    for _ in range(20):
        ds = InSituDataset(url, manifest, batch_size=BATCH_SIZE, block_chunks=2)
        assert ds.describe()["client"]["client"] == client
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, data)
        ds.close()
        del ds, batch
        counts.append(_settled(server, counts[0] if counts else None))
    assert len(server.connections) > 20  # every dataset read through connections of its own
    assert counts[0][1] == 0 and max(counts[1:]) <= counts[0], counts  # nothing grew, round 1 to round 20
