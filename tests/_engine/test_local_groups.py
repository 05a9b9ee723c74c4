"""The local-directory group kernel: zarr is the oracle, and every tile it cannot take goes the general way."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from helpers import assert_batch_matches, smooth_field
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.errors import ZarrUserWarning

import insitubatch._ext.tilegroup as tilegroup
from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.tiles.local_groups import LocalGroups, decode_buffer
from insitubatch.errors import BadChunkError

SHAPE = (26, 9, 14)
# 4 samples per chunk (the last chunk short) and 2 x 2 inner tiles with short edge tiles
CHUNKS = (4, 5, 8)
# numcodecs' zstd and blosc extensions export the codec entry points the kernel calls (wheels do);
# a build that hides them leaves every tile to the general path, which the end-to-end tests still check
KERNEL = tilegroup.bind(1, os.fsencode(numcodecs.zstd.__file__)) and tilegroup.bind(
    2, os.fsencode(numcodecs.blosc.__file__)
)
needs_kernel = pytest.mark.skipif(not KERNEL, reason="this numcodecs build does not export zstd/blosc entry points")
COMPRESSORS = {
    "v3-zstd": (3, ZstdCodec(level=1)),
    "v3-blosc": (3, BloscCodec(cname="zstd", clevel=1, shuffle="shuffle")),
    "v2-zstd": (2, numcodecs.Zstd(level=1)),
    "v2-blosc-lz4": (2, numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.BITSHUFFLE)),
}


def _write(path: Path, codec: str, dtype=np.float32) -> np.ndarray:
    fmt, compressor = COMPRESSORS[codec]
    data = smooth_field(np.random.default_rng(3), SHAPE).astype(dtype)
    root = zarr.open_group(path, mode="w", zarr_format=fmt)
    kw = {"compressors": compressor} if fmt == 3 else {"compressor": compressor}
    arr = root.create_array("v", shape=SHAPE, chunks=CHUNKS, dtype=dtype, **kw)
    arr[...] = data
    return data


class _Counting:
    """Counts what the kernel placed and handed back, around the real ``LocalGroups.run``."""

    def __init__(self, monkeypatch) -> None:
        self.placed = self.handed_back = 0
        real = LocalGroups.run

        def run(groups, kind, paths, dests, stored):
            status, nbytes, times = real(groups, kind, paths, dests, stored)
            self.placed += int((status == tilegroup.PLACED).sum())
            self.handed_back += int((status != tilegroup.PLACED).sum())
            return status, nbytes, times

        monkeypatch.setattr(LocalGroups, "run", run)


def _read_all(path: Path, **kw) -> tuple[list, dict, object]:
    store = obstore_store(str(path), read_only=True)
    g = open_geometries(store)["v"]
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, ["v"], batch_size=5, block_chunks=2, **kw) as ds:
        it = iter(ds.train)
        batches = [(b.arrays["v"].copy(), b) for b in it]
        return batches, ds.variables, it.counters


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
def test_kernel_tiles_match_zarr_edges_included(tmp_path: Path, codec: str, monkeypatch) -> None:
    path = tmp_path / "a.zarr"
    data = _write(path, codec)
    np.testing.assert_array_equal(zarr.open_array(path, path="v", mode="r")[:], data)
    counting = _Counting(monkeypatch)
    batches, variables, counters = _read_all(path)
    seen = []
    for _, batch in batches:
        assert_batch_matches(batch, variables, {"v": data})
        seen += batch.sample_indices.tolist()
    assert sorted(seen) == list(range(SHAPE[0]))
    n_chunks, tiles = -(-SHAPE[0] // CHUNKS[0]), 4
    # every tile is the kernel's: full ones decoded in place, edges (inner and the short last chunk) clipped
    assert counting.placed == (n_chunks * tiles if KERNEL else 0) and counting.handed_back == 0
    assert counters.gets == counters.decoded_tiles == n_chunks * tiles
    metadata = ("zarr.json", ".zarray", ".zattrs")
    assert counters.get_bytes == sum(
        f.stat().st_size for f in (path / "v").rglob("*") if f.is_file() and f.name not in metadata
    )


def test_missing_and_corrupt_chunks_are_handed_back(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.zarr"
    data = _write(path, "v3-zstd")
    g = open_geometries(str(path))["v"]
    missing = path / g.chunk_key((1, 0, 0))
    corrupt = path / g.chunk_key((2, 0, 0))
    os.remove(missing)
    corrupt.write_bytes(corrupt.read_bytes()[:-7])  # truncated: the frame no longer decodes to the tile
    counting = _Counting(monkeypatch)
    with pytest.raises(BadChunkError, match=r"chunk \(2, 0, 0\)"):
        _read_all(path)
    counting.placed = counting.handed_back = 0
    batches, variables, _ = _read_all(path, on_bad_chunk="nan")
    expected = data.copy()
    expected[4:8, :5, :8] = zarr.open_array(path, path="v", mode="r")[4:8, :5, :8]  # zarr: a missing chunk's fill
    expected[8:12, :5, :8] = np.nan  # the corrupt one is replaced
    for _, batch in batches:
        rows = batch.read_indices("v")
        np.testing.assert_array_equal(batch.arrays["v"], expected[rows])
    assert counting.handed_back == (2 if KERNEL else 0)  # both went to the general path, which decided


@needs_kernel
def test_an_edge_tile_is_the_leading_block_of_its_chunk(tmp_path: Path) -> None:
    chunk = np.arange(2 * 5 * 7, dtype=np.int16).reshape(2, 5, 7)
    frame = numcodecs.Blosc(cname="lz4").encode(chunk)
    f = tmp_path / "c"
    f.write_bytes(frame)
    for part in [(2, 5, 7), (1, 5, 7), (2, 3, 7), (2, 5, 4), (1, 2, 1), (2, 0, 7)]:
        dest = np.full(part, -1, dtype=np.int16)
        status, nbytes, times = np.empty(1, np.int32), np.zeros(1, np.int64), np.zeros(2, np.int64)
        whole = np.empty(chunk.nbytes, np.uint8)
        stored = np.array([chunk.shape], np.int64)
        tilegroup.read_decode(
            2, [os.fsencode(f)], [dest], stored, np.empty(4096, np.uint8), whole, status, nbytes, times
        )
        assert status[0] == 0 and nbytes[0] == len(frame), part
        np.testing.assert_array_equal(dest, chunk[: part[0], : part[1], : part[2]], err_msg=str(part))
    # an edge tile whose chunk does not fit the buffer it is decoded into is handed back untouched
    dest = np.full((1, 5, 7), -1, dtype=np.int16)
    status = np.empty(1, np.int32)
    tilegroup.read_decode(
        2,
        [os.fsencode(f)],
        [dest],
        np.array([chunk.shape], np.int64),
        np.empty(4096, np.uint8),
        np.empty(chunk.nbytes - 1, np.uint8),
        status,
        np.zeros(1, np.int64),
        np.zeros(2, np.int64),
    )
    assert status[0] == tilegroup.GROW and (dest == -1).all()


def test_a_file_larger_than_the_scratch_buffer_is_read_the_general_way(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.zarr"
    data = _write(path, "v3-blosc")
    monkeypatch.setattr("insitubatch._engine.tiles.local_groups._SCRATCH_MIN_EXTRA", 0)
    monkeypatch.setattr(
        "insitubatch._engine.tiles.local_groups._SCRATCH_SLACK", -0.9
    )  # a buffer too small for any file
    counting = _Counting(monkeypatch)
    batches, variables, _ = _read_all(path)
    for _, batch in batches:
        assert_batch_matches(batch, variables, {"v": data})
    assert counting.handed_back > 0 or not KERNEL


def test_arrays_of_other_ranks_share_a_group(tmp_path: Path, monkeypatch) -> None:
    """A group mixes tiles of every array the pass reads: a 3-d and a 2-d array with the same codec."""
    path = tmp_path / "a.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((40, 6, 8)).astype(np.float32), rng.standard_normal((40, 3)).astype(np.float32)
    root.create_array("x", shape=x.shape, chunks=(4, 6, 8), dtype=x.dtype, compressors=ZstdCodec(level=1))[...] = x
    root.create_array("y", shape=y.shape, chunks=(4, 3), dtype=y.dtype, compressors=ZstdCodec(level=1))[...] = y
    counting = _Counting(monkeypatch)
    store = obstore_store(str(path), read_only=True)
    geoms = open_geometries(store)
    with InSituDataset(
        store, split_by_chunk(geoms["x"], fractions=(1.0,)), ["x", "y"], batch_size=4, block_chunks=2
    ) as ds:
        seen = 0
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, {"x": x, "y": y})
            seen += len(batch)
    assert seen == 40 and counting.placed == (20 if KERNEL else 0)


@needs_kernel
def test_the_kernel_refuses_what_does_not_declare_the_tiles_size(tmp_path: Path) -> None:
    tile = np.arange(64, dtype=np.float32)
    zstd_frame = numcodecs.Zstd(level=1).encode(tile)
    blosc_frame = numcodecs.Blosc(cname="zstd").encode(tile)
    files = {
        "zstd": zstd_frame,
        "zstd-short": zstd_frame[:-3],
        "zstd-other-size": numcodecs.Zstd(level=1).encode(tile[:32]),
        "blosc": blosc_frame,
        "blosc-short": blosc_frame[:-3],
        "empty": b"",
    }
    for name, payload in files.items():
        (tmp_path / name).write_bytes(payload)
    (tmp_path / "a-directory").mkdir()
    names = [*files, "absent", "a-directory"]
    expected = {
        "zstd": (1, 0),
        "zstd-short": (1, 5),
        "zstd-other-size": (1, 4),
        "blosc": (2, 0),
        "blosc-short": (2, 4),
        "empty": (1, 4),
        "absent": (1, 1),
        "a-directory": (2, 1),
    }  # fmt: skip  (status 0: placed, 1: missing, 4: frame refused, 5: codec error)
    for name in names:
        kind, status_want = expected[name]
        dest = np.full(64, -1, dtype=np.float32)
        status, nbytes, times = (np.empty(1, np.int32), np.zeros(1, np.int64), np.zeros(2, np.int64))
        scratch, whole, stored = np.empty(4096, np.uint8), np.empty(0, np.uint8), np.array([[64]], np.int64)
        tilegroup.read_decode(
            kind, [os.fsencode(tmp_path / name)], [dest], stored, scratch, whole, status, nbytes, times
        )
        assert status[0] == status_want, name
        if status_want == 0:
            np.testing.assert_array_equal(dest, tile)
        else:
            assert (dest == -1).all(), f"{name}: a refused tile is left untouched"


@pytest.mark.parametrize("codec", ["v3-zstd", "v3-blosc", "v2-blosc-lz4"])
def test_network_tiles_decode_through_the_kernel_and_match_zarr(emulator, codec: str, monkeypatch) -> None:
    """Bytes from an HTTP store: the same kernel decodes them (edges clipped), bad ones go the general way."""
    import insitubatch._engine.tiles.tile_jobs as tile_jobs

    path = emulator.root / "a.zarr"
    data = _write(path, codec)
    g = open_geometries(str(path))["v"]
    corrupt = path / g.chunk_key((3, 1, 1))
    corrupt.write_bytes(corrupt.read_bytes()[:-5])
    with warnings.catch_warnings():
        # zarr warns that v3 consolidated metadata is not in the spec yet; an HTTP store cannot list members
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(path)
    outcomes: list[int] = []  # each kernel outcome of a tile: a landed batch's (decode_group) or a lone one's
    real, real_group = tile_jobs.decode_buffer, tile_jobs.decode_group

    def counting(*args):
        outcomes.append(real(*args))
        return outcomes[-1]

    def counting_group(*args):
        status, ns = real_group(*args)
        outcomes.extend(status.tolist())
        return status, ns

    monkeypatch.setattr(tile_jobs, "decode_buffer", counting)
    monkeypatch.setattr(tile_jobs, "decode_group", counting_group)
    store = obstore_store(emulator.url_for("a.zarr"), read_only=True)
    manifest = split_by_chunk(open_geometries(store)["v"], fractions=(1.0,))
    expected = data.copy()
    expected[12:16, 5:, 8:] = np.nan  # the cut-off chunk's tile, replaced
    with InSituDataset(store, manifest, ["v"], batch_size=5, block_chunks=2, on_bad_chunk="nan") as ds:
        seen = 0
        for batch in ds.train:
            np.testing.assert_array_equal(batch.arrays["v"], expected[batch.read_indices("v")])
            seen += len(batch)
    assert seen == SHAPE[0]
    n_tiles = -(-SHAPE[0] // CHUNKS[0]) * 4
    if KERNEL:
        assert len(outcomes) == n_tiles and outcomes.count(tilegroup.PLACED) == n_tiles - 1
    else:
        assert outcomes == []


@needs_kernel
def test_decode_buffer_refuses_a_destination_that_does_not_fit_its_chunk() -> None:
    chunk = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    raw = np.frombuffer(numcodecs.Zstd(level=1).encode(chunk), dtype=np.uint8)
    whole = np.empty(chunk.nbytes, np.uint8)
    with pytest.raises(ValueError, match="larger than its stored chunk"):
        decode_buffer(1, raw, np.empty((2, 3, 5), np.float32), (2, 3, 4), whole)
    with pytest.raises(ValueError, match="one entry per dim"):
        decode_buffer(1, raw, np.empty((2, 12), np.float32), (2, 3, 4), whole)
    dest = np.empty((1, 3, 2), np.float32)
    assert decode_buffer(1, raw, dest, (2, 3, 4), whole) == tilegroup.PLACED
    np.testing.assert_array_equal(dest, chunk[:1, :, :2])
