"""A network store's landed tiles decode through the group kernel, one call per batch: zarr is the oracle.

Tiles whose bytes came together (a batch of whole tiles, or a shard's run of
inner chunks) are decoded by ``tilegroup.decode_group`` with the GIL released
once; the codecs it does not know, selections and bad chunks take the per-tile
path, which raises or falls back as before.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from helpers import smooth_field
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ShardingCodec, ZstdCodec
from zarr.errors import ZarrUserWarning

import insitubatch._engine.tiles.tile_jobs as tile_jobs
import insitubatch._ext.tilegroup as tilegroup
from insitubatch import InSituDataset, applies, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.tiles.local_groups import decode_group
from insitubatch._engine.tiles.remote_tiles import RemoteTiles
from insitubatch.errors import BadChunkError
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator

SHAPE = (26, 9, 14)
# 4 samples per chunk (the last chunk short), 2 x 2 tiles with short edge tiles
CHUNKS = (4, 5, 8)
N_TILES = 7 * 4
KERNEL = tilegroup.bind(1, os.fsencode(numcodecs.zstd.__file__)) and tilegroup.bind(
    2, os.fsencode(numcodecs.blosc.__file__)
)
needs_kernel = pytest.mark.skipif(not KERNEL, reason="this numcodecs build does not export zstd/blosc entry points")
# (zarr format, compressor, dtype, whether the group kernel decodes it)
CASES = {
    "v3-zstd-f4": (3, ZstdCodec(level=1), "f4", True),
    "v3-blosc-i2": (3, BloscCodec(cname="zstd", clevel=1, shuffle="shuffle"), "i2", True),
    "v2-zstd-f8": (2, numcodecs.Zstd(level=1), "f8", True),
    "v2-blosc-lz4-u1": (2, numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.BITSHUFFLE), "u1", True),
    "v3-gzip-f4": (3, GzipCodec(level=1), "f4", False),
    "v3-raw-i4": (3, None, "i4", False),
}


class _Calls:
    """Every ``decode_group`` call of the landed jobs: its tiles, and how many it placed."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[int, int]] = []

        def counted(kind, raws, dests, stored, whole):
            status, ns = decode_group(kind, raws, dests, stored, whole)
            self.calls.append((len(raws), int((status == tilegroup.PLACED).sum())))
            return status, ns

        monkeypatch.setattr(tile_jobs, "decode_group", counted)

    @property
    def placed(self) -> int:
        return sum(p for _, p in self.calls)

    @property
    def handed_back(self) -> int:
        return sum(n - p for n, p in self.calls)


def _write(path: Path, case: str) -> np.ndarray:
    fmt, compressor, dtype, _ = CASES[case]
    data = smooth_field(np.random.default_rng(3), SHAPE, dtype)
    root = zarr.open_group(path, mode="w", zarr_format=fmt)
    kw = {"compressors": compressor} if fmt == 3 else {"compressor": compressor}
    root.create_array("v", shape=SHAPE, chunks=CHUNKS, dtype=dtype, **kw)[...] = data
    return zarr.open_array(path, path="v", mode="r")[...]


def _read_remote(root: Path, name: str, selection=None, **kw) -> tuple[list, object, list]:
    """Every batch of one pass over HTTP (``(rows, values)``), the pass's counters and the bad-chunk records."""
    with Emulator(root, latency_s=0.01, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for(name), read_only=True)
        try:
            g = open_geometries(store, variables=["v"])["v"]
            view = g if selection is None else g.isel(selection)
            manifest = split_by_chunk(g, fractions=(1.0,))
            with InSituDataset(store, manifest, {"v": view}, batch_size=5, decode_threads=1, **kw) as ds:
                it = iter(ds.train)
                batches = [(b.sample_indices.copy(), b.arrays["v"].copy()) for b in it]
                return batches, it.counters, list(ds.bad_chunks)
        finally:
            close_store(store)


@pytest.mark.parametrize("case", sorted(CASES))
def test_landed_batches_equal_zarr_through_the_kernel_or_the_per_tile_path(tmp_path, case, monkeypatch) -> None:
    data = _write(tmp_path / "a.zarr", case)
    calls = _Calls(monkeypatch)
    batches, counters, bad = _read_remote(tmp_path, "a.zarr")
    seen = []
    for rows, values in batches:
        np.testing.assert_array_equal(values, data[rows])
        seen += rows.tolist()
    assert sorted(seen) == list(range(SHAPE[0])) and bad == []
    assert counters.gets == counters.decoded_tiles == N_TILES
    if CASES[case][3] and KERNEL:
        # every tile, full and edge, placed by the kernel; tiles that landed together shared a call
        assert calls.placed == N_TILES and calls.handed_back == 0
        assert len(calls.calls) < N_TILES
    else:
        assert calls.calls == []  # a codec the kernel does not know: the per-tile path decoded every tile


def test_a_selection_cuts_from_the_kernels_tile_or_goes_the_per_tile_way(tmp_path, monkeypatch) -> None:
    """Two views of one array share its tiles: the whole view's is the kernel's, the selection cut from it."""
    data = _write(tmp_path / "a.zarr", "v3-zstd-f4")
    calls = _Calls(monkeypatch)
    # a selection alone: no view keeps the tile whole, so the per-tile path decodes and cuts it
    batches, _, _ = _read_remote(tmp_path, "a.zarr", selection={2: slice(None, None, -1)})
    for rows, values in batches:
        np.testing.assert_array_equal(values, data[rows][:, :, ::-1])
    assert calls.calls == []
    with Emulator(tmp_path, latency_s=0.01, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        views = {"whole": g, "cut": g.isel({1: slice(1, 8, 2)})}
        with InSituDataset(store, split_by_chunk(g, fractions=(1.0,)), views, batch_size=5, decode_threads=1) as ds:
            for batch in ds.train:
                rows = batch.sample_indices
                np.testing.assert_array_equal(batch.arrays["whole"], data[rows])
                np.testing.assert_array_equal(batch.arrays["cut"], data[rows][:, 1:8:2])
        close_store(store)
    assert not KERNEL or calls.placed == N_TILES


def test_a_chunk_transform_sees_the_kernels_tiles(tmp_path, monkeypatch) -> None:
    data = _write(tmp_path / "a.zarr", "v3-zstd-f4")

    def plus_one(chunk):
        chunk.data += 1
        return chunk

    calls = _Calls(monkeypatch)
    batches, _, _ = _read_remote(tmp_path, "a.zarr", chunk_transforms=[applies(["v"], plus_one)])
    for rows, values in batches:
        np.testing.assert_array_equal(values, data[rows] + 1)
    assert not KERNEL or calls.placed == N_TILES


def test_one_corrupt_chunk_in_a_batch_is_nan_and_listed_the_others_equal_zarr(tmp_path, monkeypatch) -> None:
    data = _write(tmp_path / "a.zarr", "v3-zstd-f4")
    corrupt = tmp_path / "a.zarr" / open_geometries(str(tmp_path / "a.zarr"))["v"].chunk_key((2, 1, 0))
    corrupt.write_bytes(corrupt.read_bytes()[:-7])  # truncated: its frame still declares the tile's size
    calls = _Calls(monkeypatch)

    def arrive_slowly(self, batch, want, coord, key, buf):  # tiles landing within 0.1 s share a batch, however loaded
        if not self._arrived:
            self.tasks.loop.call_later(0.1, self._land_arrived)
        self._arrived.append((batch, want, coord, key, buf))

    monkeypatch.setattr(RemoteTiles, "arrive", arrive_slowly)
    with pytest.raises(BadChunkError, match=r"chunk \(2, 1, 0\)"):
        _read_remote(tmp_path, "a.zarr")
    calls.calls.clear()
    batches, _, bad = _read_remote(tmp_path, "a.zarr", on_bad_chunk="nan")
    expected = data.copy()
    expected[8:12, 5:, :8] = np.nan
    for rows, values in batches:
        np.testing.assert_array_equal(values, expected[rows])
    assert len(bad) == 1 and bad[0].chunk_index == 2
    if KERNEL:
        # the corrupt tile was in a kernel call with others, handed back alone, and decided by the per-tile path
        assert calls.handed_back == 1 and calls.placed == N_TILES - 1
        assert any(n > 1 and p == n - 1 for n, p in calls.calls)


def test_a_shards_run_of_inner_chunks_decodes_in_one_call(tmp_path, monkeypatch) -> None:
    shape = (37, 10, 12)
    data = np.random.default_rng(3).standard_normal(shape).astype("f4")
    data[10:12, :5, 6:] = 0.0  # an inner chunk of fill value: never written, no GET
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.open_group(tmp_path / "s.zarr", mode="w").create_array(
            "v",
            shape=shape,
            chunks=(8, 10, 12),
            dtype="f4",
            fill_value=0.0,
            serializer=ShardingCodec(chunk_shape=(2, 5, 6), codecs=[BytesCodec(), ZstdCodec()]),
            compressors=None,
        )[...] = data
    data = zarr.open_array(tmp_path / "s.zarr" / "v", mode="r")[...]
    calls = _Calls(monkeypatch)
    with Emulator(tmp_path, latency_s=0.01, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("s.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        assert g.sharded_reads
        with InSituDataset(
            store, split_by_chunk(g, fractions=(1.0,)), ["v"], batch_size=5, block_chunks=3, decode_threads=1
        ) as ds:
            seen = 0
            for batch in ds.train:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
                seen += len(batch)
        close_store(store)
    assert seen == shape[0]
    if KERNEL:
        inner = 19 * 4 - 1  # every written inner chunk
        assert calls.placed == inner and calls.handed_back == 0 and max(n for n, _ in calls.calls) > 1


@needs_kernel
def test_decode_group_places_full_and_edge_tiles_and_hands_back_bad_frames() -> None:
    chunk = np.arange(4 * 5 * 7, dtype=np.float32).reshape(4, 5, 7)
    other = -chunk[:, :3]  # another array's chunk shape in the same call
    zstd = numcodecs.Zstd(level=1)
    frames = [zstd.encode(chunk), zstd.encode(chunk), zstd.encode(other), zstd.encode(chunk)[:-5], zstd.encode(chunk)]
    parts = [(4, 5, 7), (3, 2, 7), (4, 3, 7), (4, 5, 7), (1, 5, 1)]
    stored = [chunk.shape, chunk.shape, other.shape, chunk.shape, chunk.shape]
    dests = [np.full(p, -1, dtype=np.float32) for p in parts]
    raws = [np.frombuffer(f, dtype=np.uint8) for f in frames]
    status, ns = decode_group(1, raws, dests, stored, np.empty(chunk.nbytes, np.uint8))
    assert status.tolist() == [0, 0, 0, 5, 0] and ns > 0  # the truncated frame: a codec error, handed back
    for i in (0, 1, 4):
        np.testing.assert_array_equal(dests[i], chunk[tuple(slice(0, n) for n in parts[i])])
    np.testing.assert_array_equal(dests[2], other)
    assert (dests[3] == -1).all()  # untouched
    # an edge tile whose chunk does not fit ``whole`` is handed back untouched too
    dest = np.full((1, 5, 7), -1, dtype=np.float32)
    status, _ = decode_group(1, raws[:1], [dest], stored[:1], np.empty(chunk.nbytes - 1, np.uint8))
    assert status.tolist() == [tilegroup.GROW] and (dest == -1).all()
    with pytest.raises(ValueError, match="srcs, dests and status"):
        decode_group(1, raws, dests[:2], stored, np.empty(chunk.nbytes, np.uint8))
