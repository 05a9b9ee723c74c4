"""A remote pass admits its second block only once its first block's reads have landed (time to first batch)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr
from helpers import shard_keys

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.tiles.remote_tiles import RemoteTiles
from insitubatch.testing.emulator import Emulator

SHAPE = (40, 10, 12)


def _write(path, sharded: bool) -> np.ndarray:
    """An array ``v`` of 20 chunks of 2 samples; sharded: 4 chunks per shard."""
    data = np.random.default_rng(5).standard_normal(SHAPE).astype("f4")
    shards = {"shards": (8, 10, 12)} if sharded else {}
    arr = zarr.open_group(path, mode="w").create_array("v", shape=SHAPE, chunks=(2, 10, 12), dtype="f4", **shards)
    arr[:] = data
    return data


@pytest.mark.parametrize("sharded", [False, True])
def test_a_remote_pass_reads_its_first_block_alone(tmp_path, monkeypatch, sharded) -> None:
    """Every read of the first block ends before a later block's read (or a later shard's index) starts."""
    data = _write(tmp_path / "a.zarr", sharded)
    reads: list[
        tuple[float, float, list[int]]
    ] = []  # (start, landed, chunks) per batch of tiles or run of inner chunks
    index_starts: dict[str, float] = {}
    fetch_tiles, fetch_run, start = RemoteTiles._fetch_tiles, RemoteTiles._fetch_run, Fetcher.start

    async def logged_tiles(self, wants):  # (one batch: from its first read's start to its last landing)
        t0 = time.perf_counter()
        await fetch_tiles(self, wants)
        reads.append((t0, time.perf_counter(), [want.chunk_index for want in wants]))

    async def logged_run(self, key, run, *tag):
        t0 = time.perf_counter()
        await fetch_run(self, key, run, *tag)
        reads.append((t0, time.perf_counter(), [want.chunk_index for _, _, want, _ in run]))

    def logged_start(self, key, byte_range, *args, **kwargs):  # (every read the fetcher makes begins here)
        if type(byte_range).__name__ == "SuffixByteRequest":  # a shard index (at the end)
            index_starts.setdefault(key, time.perf_counter())
        return start(self, key, byte_range, *args, **kwargs)

    monkeypatch.setattr(RemoteTiles, "_fetch_tiles", logged_tiles)
    monkeypatch.setattr(RemoteTiles, "_fetch_run", logged_run)
    monkeypatch.setattr(Fetcher, "start", logged_start)
    with Emulator(tmp_path, latency_s=0.01, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        manifest = split_by_chunk(g, fractions=(1.0,))
        with InSituDataset(store, manifest, {"v": g}, batch_size=2, block_chunks=2, seed=3) as ds:
            it = iter(ds.train)
            for batch in it:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
            plan = it.plan
    first = set(int(plan.reads[i][1]) for i in np.flatnonzero(plan.read_first == plan.read_first.min()))
    first_reads = [r for r in reads if set(r[2]) <= first]
    later_reads = [r for r in reads if not set(r[2]) <= first]
    assert {c for r in first_reads for c in r[2]} == first and later_reads
    landed = max(end for _, end, _ in first_reads)
    assert min(start for start, _, _ in later_reads) >= landed
    if sharded:
        first_shards = set(shard_keys(g, range(g.tiles_per_chunk), sorted(first)))
        later_indexes = [t for key, t in index_starts.items() if key not in first_shards]
        assert first_shards <= set(index_starts) and later_indexes
        assert min(later_indexes) >= landed
