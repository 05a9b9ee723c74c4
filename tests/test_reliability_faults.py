"""Store faults through the benchmark's loopback object store: retried, or raised naming the key, never wrong.

A real zarr group (a 2x-tiled array and a sharded one) is written with
zarr-python into the emulator's directory and read over HTTP by
``obstore_store`` + ``InSituDataset``. Transient faults (5xx, Retry-After,
connection reset, truncated body, stall past the read timeout) are retried by
obstore's client and every batch still equals zarr-python's read; persistent
ones (403, a 500 that never clears, a stall on every attempt) raise
``StoreReadError`` in the consumer, naming array, chunk and key, within a
time bound; a 404 on a chunk key reads as the fill value.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import zarr
from helpers import assert_batch_matches, smooth_field, write_array
from zarr.errors import ZarrUserWarning

from insitubatch.dataset import InSituDataset
from insitubatch.errors import StoreReadError
from insitubatch.io.geometry import ArrayGeometry
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import SplitManifest, split_by_chunk
from insitubatch.stores.obstore_stores import DEFAULT_CLIENT_OPTIONS, DEFAULT_RETRY, obstore_store
from insitubatch.stores.owned import close_store

GROUP = "x.zarr"
SHAPE = (48, 6, 8)
FILL = -7.0
BATCH_SIZE = 5
# Retries that fit a test: quick backoff, and enough attempts that a fault
# which fires at most FAULT_TIMES times per key always clears.
FAULT_TIMES = 2
FAST_RETRY = {
    "max_retries": 5,
    "backoff": {"init_backoff": timedelta(milliseconds=5), "max_backoff": timedelta(milliseconds=50), "base": 2},
    "retry_timeout": timedelta(seconds=30),
}
# A persistent fault exhausts these quickly.
FEW_RETRIES = {**FAST_RETRY, "max_retries": 2}
# The emulator's stall outlasts the read timeout, so the client gives up on it.
READ_TIMEOUT_S = 1.0
STALL_S = 20.0
CLIENT_OPTIONS = {"read_timeout": f"{int(READ_TIMEOUT_S * 1000)}ms", "timeout": "10s", "connect_timeout": "2s"}
# A persistent fault must reach the consumer within this: (1 + FEW_RETRIES)
# attempts, each at most one READ_TIMEOUT_S stall, plus backoff, with ample
# slack for a loaded 2-core CI machine.
PERSISTENT_BOUND_S = 15.0
CLOSE_BOUND_S = 5.0
TRANSIENT_KINDS = ("500", "503", "retry-after", "reset", "truncate", "stall")


@dataclass
class Served:
    """The group on the emulator and zarr-python's read of each array (the oracle)."""

    emu: Any
    data: dict[str, np.ndarray]
    geoms: dict[str, ArrayGeometry]
    manifest: SplitManifest

    def store(self, retry: dict[str, Any] = FAST_RETRY, client_options: dict[str, Any] = CLIENT_OPTIONS):
        return obstore_store(self.emu.url_for(GROUP), read_only=True, retry=retry, client_options=client_options)

    def n_batches(self, split: str) -> int:
        return -(-len(self.manifest.sample_indices(split)) // BATCH_SIZE)

    def chunk_keys(self, path: str) -> list[str]:
        """Every stored-chunk key of ``path`` relative to the group."""
        g = self.geoms[path]
        keys = (
            g.tile_key(g.physical_chunk_coord(c, t))[0] for c in range(g.n_chunks) for t in range(g.tiles_per_chunk)
        )
        return list(dict.fromkeys(keys))  # a shard holds several tiles


@pytest.fixture
def served(emulator) -> Served:
    rng = np.random.default_rng(11)
    root = zarr.open_group(emulator.root / GROUP, mode="w")
    # v: 12 sample-axis chunks of 2 tiles each; s: 12 shards of 2x2 inner chunks
    write_array(root, "v", smooth_field(rng, SHAPE), (4, 3, 8), fill_value=FILL)
    write_array(root, "s", smooth_field(rng, SHAPE), (2, 3, 8), shards=(4, 6, 8), fill_value=FILL)
    with warnings.catch_warnings():
        # zarr warns that v3 consolidated metadata is not in the spec yet; an
        # HTTP store cannot list members, so readers find the arrays there
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(root.store)
    local = zarr.open_group(emulator.root / GROUP, mode="r")
    data = {name: local[name][...] for name in ("v", "s")}
    reader = obstore_store(emulator.url_for(GROUP), read_only=True)
    geoms = open_geometries(reader)
    close_store(reader)
    manifest = split_by_chunk(geoms["v"], fractions=(0.75, 0.25))
    return Served(emulator, data, geoms, manifest)


def _read_epochs(served: Served, store, epochs: int, **kw: Any) -> int:
    """Iterate ``epochs`` shuffled train epochs and a val pass, oracle-checking every batch; return the batch count."""
    n = 0
    with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, max_inflight=8, **kw) as ds:
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            seen: list[int] = []
            for batch in ds.train:
                assert_batch_matches(batch, ds.variables, served.data)
                seen.extend(batch.sample_indices.tolist())
                n += 1
            assert sorted(seen) == served.manifest.sample_indices("train").tolist()
        for batch in ds.val:
            assert_batch_matches(batch, ds.variables, served.data)
            n += 1
    return n


def _prefetch_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "insitu-prefetch")


# --- transient faults: retried, and every batch still matches ---------------------


@pytest.mark.parametrize("kind", TRANSIENT_KINDS)
def test_transient_faults_are_retried_and_every_batch_matches(served: Served, kind: str) -> None:
    emu = served.emu
    # every other chunk key of both arrays fails FAULT_TIMES times, then is served
    faulty = [f"{GROUP}/{k}" for path in ("v", "s") for k in served.chunk_keys(path)[::2]]
    times = 1 if kind == "stall" else FAULT_TIMES
    faults = [emu.inject(kind, key, times=times, stall_s=STALL_S) for key in faulty]
    store = served.store()
    emu.reset_stats()
    t0 = time.monotonic()
    batches = _read_epochs(served, store, epochs=2)
    elapsed = time.monotonic() - t0
    close_store(store)
    assert [f.fired for f in faults] == [times] * len(faults), "every injected fault must have hit a read"
    stats = emu.stats()
    for key in faulty:
        assert stats.keys[key].gets >= times + 1, f"{key} was not retried after its {kind} fault"
    assert batches == 2 * served.n_batches("train") + served.n_batches("val")
    print(f"{kind}: {len(faults)} keys x {times} faults, {batches} batches, all equal to zarr, {elapsed:.1f}s")


@pytest.mark.slow
def test_random_mixed_faults_over_fresh_datasets(served: Served) -> None:
    """Every transient kind at once on random GETs; each epoch a fresh dataset, so every chunk is fetched again."""
    emu = served.emu
    rules = [emu.inject(kind, f"{GROUP}/*/c/*", probability=0.06, stall_s=STALL_S) for kind in TRANSIENT_KINDS[:-1]]
    rules.append(emu.inject("stall", f"{GROUP}/*/c/*", probability=0.02, stall_s=STALL_S))
    store = served.store(retry={**FAST_RETRY, "max_retries": 8})
    batches = sum(_read_epochs(served, store, epochs=1, seed=epoch) for epoch in range(3))
    close_store(store)
    fired = {r.kind: r.fired for r in rules}
    assert sum(fired.values()) >= 5, f"too few faults fired to mean anything: {fired}"
    print(f"mixed: faults fired {fired}, {batches} batches, all equal to zarr")


# --- persistent faults: StoreReadError naming the key, within a bound ---------------


@pytest.mark.parametrize(
    "kind, on_bad_chunk",
    [("403", "raise"), ("500", "raise"), ("500", "nan"), ("503", "raise"), ("stall", "raise")],
)
def test_persistent_fault_raises_store_read_error_in_bounded_time(served: Served, kind: str, on_bad_chunk: str) -> None:
    emu = served.emu
    g = served.geoms["v"]
    last = served.manifest.chunks("train")[-1]
    coord = g.physical_chunk_coord(last, 1)
    key = g.chunk_key(coord)
    fault = emu.inject(kind, f"{GROUP}/{key}", stall_s=STALL_S)
    store = served.store(retry=FEW_RETRIES)
    # sequential, so the failing chunk comes last and the batches before it are handed over first
    ds = InSituDataset(
        store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, shuffle=False, on_bad_chunk=on_bad_chunk
    )
    good = 0
    t0 = time.monotonic()
    with pytest.raises(StoreReadError) as info:
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, served.data)  # nothing wrong is ever handed over
            good += 1
    elapsed = time.monotonic() - t0
    assert good == last * g.sample_chunk_size // BATCH_SIZE  # every batch before the failing chunk
    message = str(info.value)
    assert "array 'v'" in message and f"chunk {coord}" in message and f"key {key!r}" in message, message
    assert elapsed < PERSISTENT_BOUND_S, f"{kind} took {elapsed:.1f}s to surface"
    assert fault.fired >= 1 + (0 if kind == "403" else FEW_RETRIES["max_retries"])
    assert ds.bad_chunks == []  # a store outage is not a bad chunk, whatever on_bad_chunk says
    t0 = time.monotonic()
    ds.close()
    close_store(store)
    assert time.monotonic() - t0 < CLOSE_BOUND_S
    deadline = time.monotonic() + CLOSE_BOUND_S
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _prefetch_threads() == 0
    print(f"persistent {kind}: {good} good batches, then StoreReadError after {elapsed:.1f}s")


def test_a_failed_chunk_is_read_again_once_the_store_recovers(served: Served) -> None:
    emu = served.emu
    key = served.chunk_keys("s")[3]
    emu.inject("500", f"{GROUP}/{key}")
    store = served.store(retry=FEW_RETRIES)
    with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2) as ds:
        with pytest.raises(StoreReadError, match=f"key '{key}'"):
            for _ in ds.train:
                pass
        emu.clear_faults()
        n = 0
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, served.data)
            n += 1
        assert n == len(ds.train)
    close_store(store)


@pytest.mark.parametrize("kind", ["truncate", "reset"])
def test_a_short_body_without_retries_is_an_error_not_data(served: Served, kind: str) -> None:
    """With retries off, a body cut short fails the read: it is never decoded as (wrong) data."""
    emu = served.emu
    key = served.chunk_keys("v")[7]
    emu.inject(kind, f"{GROUP}/{key}", times=1)
    store = served.store(retry={"max_retries": 0})
    with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, on_bad_chunk="nan") as ds:
        with pytest.raises(StoreReadError, match=f"key '{key}'"):
            for batch in ds.train:
                assert_batch_matches(batch, ds.variables, served.data)
        assert ds.bad_chunks == []
    close_store(store)


# --- 404 on a chunk key: the fill value, as zarr reads it ---------------------------


def test_404_on_a_chunk_key_reads_as_the_fill_value(served: Served) -> None:
    emu = served.emu
    gv, gs = served.geoms["v"], served.geoms["s"]
    missing = {"v": (gv.physical_chunk_coord(2, 1), 2), "s": (gs.physical_chunk_coord(6, 0), 6)}
    for path, (coord, _) in missing.items():
        emu.inject("404", f"{GROUP}/{served.geoms[path].chunk_key(coord)}")
    expected = {path: values.copy() for path, values in served.data.items()}
    expected["v"][8:12, 3:6, :] = FILL  # chunk 2, tile (1, 0)
    expected["s"][24:28] = FILL  # shard 6
    store = served.store()
    # zarr-python through the same faulty store agrees
    group = zarr.open_group(store, mode="r")
    for path in ("v", "s"):
        np.testing.assert_array_equal(group[path][...], expected[path])
    n = 0
    with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2) as ds:
        for split in ("train", "val"):
            for batch in ds.split(split):
                assert_batch_matches(batch, ds.variables, expected)
                n += 1
        assert ds.bad_chunks == []
    close_store(store)
    assert n > 0


# --- the store constructor's network defaults -------------------------------------


def test_remote_stores_get_finite_timeouts_and_retries_by_default(served: Served) -> None:
    store = obstore_store(served.emu.url_for(GROUP), read_only=True)
    options, retry = store.store.client_options, store.store.retry_config
    for name, value in DEFAULT_CLIENT_OPTIONS.items():
        assert options[name] == value
    assert retry["max_retries"] == DEFAULT_RETRY["max_retries"]
    assert retry["retry_timeout"] == DEFAULT_RETRY["retry_timeout"]
    close_store(store)
    # a caller's keys replace the defaults one by one
    store = obstore_store(
        served.emu.url_for(GROUP), read_only=True, retry={"max_retries": 1}, client_options={"read_timeout": "2s"}
    )
    assert store.store.client_options["read_timeout"] == "2s"
    assert store.store.client_options["timeout"] == DEFAULT_CLIENT_OPTIONS["timeout"]
    assert store.store.retry_config["max_retries"] == 1
    assert store.store.retry_config["retry_timeout"] == DEFAULT_RETRY["retry_timeout"]
    close_store(store)
    s3 = obstore_store("s3://bucket/prefix", anonymous=True, endpoint="http://127.0.0.1:1")
    assert s3.store.client_options["read_timeout"] == DEFAULT_CLIENT_OPTIONS["read_timeout"]
    assert s3.store.retry_config["max_retries"] == DEFAULT_RETRY["max_retries"]
