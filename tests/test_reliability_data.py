"""Corrupt and hostile data through the whole engine: a clear error, or NaN tiles on request, never garbage.

Each case damages a real zarr written by zarr-python (bytes of a chunk, the
length of a chunk, a shard's index, the metadata) and iterates an
``InSituDataset`` over it. ``on_bad_chunk="raise"`` must raise
``BadChunkError`` naming array, chunk and key; ``"nan"`` must hand over NaN
exactly where the damaged tile lies and zarr's values everywhere else, and
list the tile in ``bad_chunks``. Absurd metadata is refused before anything
of the size it claims is allocated.
"""

from __future__ import annotations

import json
import resource
import struct
from pathlib import Path

import crc32c
import numcodecs
import numpy as np
import pytest
import zarr
from helpers import CountingStore, assert_batch_matches, local_store, smooth_field, write_array
from zarr.codecs import BloscCodec, Crc32cCodec

from insitubatch.dataset import InSituDataset
from insitubatch.errors import BadChunkError, StoreReadError
from insitubatch.io.arrays import MAX_CHUNK_BYTES, MAX_CHUNKS_PER_READ
from insitubatch.io.decode import shard_stage
from insitubatch.io.geometry import ArrayGeometry
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk

SHAPE = (24, 4, 6)
BATCH_SIZE = 5
# Peak RSS may not grow by this much while absurd metadata is refused: a small
# fraction of the gigabytes to terabytes it claims.
RSS_SLACK_BYTES = 256 * 2**20

ARRAYS = {
    # name: (zarr_format, chunks, shards, compressors)
    "zstd": (3, (4, 4, 3), None, "auto"),
    "raw": (3, (4, 4, 3), None, None),
    "crc": (3, (4, 4, 3), None, "crc32c"),
    "sharded": (3, (2, 4, 3), (4, 4, 6), "auto"),
    "blosc": (2, (4, 4, 3), None, "blosc"),
    "blosc3": (3, (4, 4, 3), None, "blosc"),
}


def _write(path: Path, name: str) -> np.ndarray:
    zarr_format, chunks, shards, compressors = ARRAYS[name]
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    data = smooth_field(np.random.default_rng(len(name)), SHAPE)
    kw = {}
    if compressors is None:
        kw["compressors"] = None
    elif compressors == "crc32c":
        kw["compressors"] = [Crc32cCodec()]
    elif compressors == "blosc":
        kw["compressors"] = BloscCodec(cname="lz4") if zarr_format == 3 else numcodecs.Blosc(cname="lz4")
    write_array(root, name, data, chunks, shards=shards, **kw)
    return data


def _open(path: Path, name: str) -> tuple[ArrayGeometry, object]:
    g = open_geometries(str(path), variables=[name])[name]
    return g, split_by_chunk(g, fractions=(1.0,))


def _key_file(path: Path, g: ArrayGeometry, chunk: int, tile: int) -> Path:
    """The file a tile is stored in: its own, or its shard's."""
    return path / g.tile_key(g.physical_chunk_coord(chunk, tile))[0]


def _shard_tiles(g: ArrayGeometry, chunk: int, tile: int) -> list[tuple[int, int]]:
    """Every ``(chunk, tile)`` stored in the same file as ``(chunk, tile)``: a damaged file makes all of them bad."""
    key = g.tile_key(g.physical_chunk_coord(chunk, tile))[0]
    return [
        (c, t)
        for c in range(g.n_chunks)
        for t in range(g.tiles_per_chunk)
        if g.tile_key(g.physical_chunk_coord(c, t))[0] == key
    ]


def _where(g: ArrayGeometry, coord: tuple[int, ...]) -> str:
    """How an error names a tile's bytes: its key, and its inner chunk when it is read out of a shard."""
    key, place = g.tile_key(coord)
    return f"key {key!r}" + (f", inner chunk {place}" if place is not None else "")


def _tile_region(g: ArrayGeometry, chunk: int, tile: int) -> tuple[slice, ...]:
    """Where tile ``tile`` of sample-axis chunk ``chunk`` lies in the whole array (sample axis first)."""
    placement = g.tile_placement(chunk, tile)
    rows = placement.out_selection[0]
    start = chunk * g.sample_chunk_size
    return (slice(start + rows.start, start + rows.stop), *placement.out_selection[1:])


def _iterate(path: Path, name: str, expected: np.ndarray, **kw) -> InSituDataset:
    """Iterate one shuffled epoch, checking every batch against ``expected``; returns the (closed) dataset."""
    g, manifest = _open(path, name)
    with InSituDataset(str(path), manifest, [name], batch_size=BATCH_SIZE, block_chunks=2, **kw) as ds:
        seen = []
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, {name: expected})
            seen.extend(batch.sample_indices.tolist())
        assert sorted(seen) == list(range(SHAPE[0]))
    return ds


def _expect_bad(
    path: Path, name: str, g: ArrayGeometry, chunk: int, tile: int, why: str, *, also: list[tuple[int, int]] = ()
) -> None:
    """Iterating raises ``BadChunkError`` naming tile ``(chunk, tile)`` (or one of ``also``, damaged with it)."""
    _, manifest = _open(path, name)
    with InSituDataset(str(path), manifest, [name], batch_size=BATCH_SIZE, block_chunks=2) as ds:
        with pytest.raises(BadChunkError) as info:
            for _ in ds.train:
                pass
    message = str(info.value)
    coords = [g.physical_chunk_coord(c, t) for c, t in [(chunk, tile), *also]]
    named = [f"chunk {coord} of array {name!r} ({_where(g, coord)})" for coord in coords]
    assert any(n in message for n in named), message
    assert why.lower() in message.lower(), message


def _expect_nan_tile(
    path: Path,
    name: str,
    data: np.ndarray,
    g: ArrayGeometry,
    chunk: int,
    tile: int,
    *,
    also: list[tuple[int, int]] = (),
) -> None:
    """Under ``on_bad_chunk="nan"`` exactly tile ``(chunk, tile)`` (and ``also``) is NaN and listed, nothing else."""
    expected = data.copy()
    bad = sorted({(chunk, tile), *also})
    for c, t in bad:
        expected[_tile_region(g, c, t)] = np.nan
    ds = _iterate(path, name, expected, on_bad_chunk="nan")
    listed = sorted((r.chunk_index, r.inner_coord) for r in ds.bad_chunks)
    assert all(r.array == name for r in ds.bad_chunks)
    assert listed == sorted((c, g.tile_coord(t)) for c, t in bad)


# --- garbage and wrong-length chunks ----------------------------------------------


@pytest.mark.parametrize("name", list(ARRAYS))
def test_garbage_bytes_raise_or_become_nan_exactly_there(tmp_path: Path, name: str) -> None:
    path = tmp_path / "g.zarr"
    data = _write(path, name)
    g, _ = _open(path, name)
    chunk, tile = 3, g.tiles_per_chunk - 1
    target = _key_file(path, g, chunk, tile)
    blob = bytes(b ^ 0xA5 for b in target.read_bytes())
    target.write_bytes(blob)
    if name == "raw":
        # no codec and no checksum: garbage of the right length is indistinguishable from data,
        # so the engine must read exactly what zarr reads
        _iterate(path, name, zarr.open_array(path / name, mode="r")[...])
        return
    # a garbled shard garbles its index too: every inner chunk read through it is bad, none other
    also = [t for t in _shard_tiles(g, chunk, tile) if t != (chunk, tile)]
    _expect_bad(path, name, g, chunk, tile, "checksum" if name == "crc" else "", also=also)
    _expect_nan_tile(path, name, data, g, chunk, tile, also=also)


def test_garbage_in_one_inner_chunk_of_a_shard_is_bad_there_only(tmp_path: Path) -> None:
    """Inner chunks are read alone: damage inside one leaves its shard's other inner chunks good."""
    path = tmp_path / "g.zarr"
    data = _write(path, "sharded")
    g, _ = _open(path, "sharded")
    chunk, tile = 3, 1
    target = _key_file(path, g, chunk, tile)
    blob = bytearray(target.read_bytes())
    stage = shard_stage(g)
    offsets, lengths, _ = stage.read_index(np.frombuffer(bytes(blob[-stage.index_nbytes :]), dtype=np.uint8))
    place = g.tile_key(g.physical_chunk_coord(chunk, tile))[1]
    start, n = int(offsets[place]), int(lengths[place])
    blob[start : start + n] = bytes(b ^ 0xA5 for b in blob[start : start + n])
    target.write_bytes(bytes(blob))
    _expect_bad(path, "sharded", g, chunk, tile, "")
    _expect_nan_tile(path, "sharded", data, g, chunk, tile)


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("change", ["truncated", "extended", "empty"])
def test_chunks_of_the_wrong_length_are_never_data(tmp_path: Path, name: str, change: str) -> None:
    path = tmp_path / "w.zarr"
    data = _write(path, name)
    g, _ = _open(path, name)
    chunk, tile = 1, 0
    target = _key_file(path, g, chunk, tile)
    blob = target.read_bytes()
    blob = {"truncated": blob[: len(blob) * 2 // 3], "extended": blob + b"\x00" * 24, "empty": b""}[change]
    target.write_bytes(blob)
    why = "expected" if name == "raw" and change != "empty" else ""
    if name == "crc" and change == "extended":
        why = "checksum"
    # a shard of the wrong length has a wrong index at its end: all of its inner chunks are bad
    also = [t for t in _shard_tiles(g, chunk, tile) if t != (chunk, tile)]
    _expect_bad(path, name, g, chunk, tile, why, also=also)
    _expect_nan_tile(path, name, data, g, chunk, tile, also=also)


def test_an_uncompressed_chunk_of_the_wrong_length_names_both_sizes(tmp_path: Path) -> None:
    path = tmp_path / "r.zarr"
    _write(path, "raw")
    g, _ = _open(path, "raw")
    target = _key_file(path, g, 2, 1)
    target.write_bytes(target.read_bytes()[:-8])
    nbytes = 4 * 4 * 3 * 4
    _expect_bad(path, "raw", g, 2, 1, f"decoded {nbytes - 8} bytes, expected {nbytes}")


def test_a_zstd_frame_claiming_a_terabyte_is_a_bad_chunk_not_an_allocation(tmp_path: Path) -> None:
    path = tmp_path / "bomb.zarr"
    data = _write(path, "zstd")
    g, _ = _open(path, "zstd")
    # a single-segment zstd frame whose header declares 1 TB of content, then one 4-byte raw block
    frame = struct.pack("<IB", 0xFD2FB528, 0b11100000) + struct.pack("<Q", 10**12)
    frame += struct.pack("<I", (4 << 3) | 1)[:3] + b"boom"
    _key_file(path, g, 4, 0).write_bytes(frame)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _expect_bad(path, "zstd", g, 4, 0, "zstd")
    _expect_nan_tile(path, "zstd", data, g, 4, 0)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak < RSS_SLACK_BYTES


# --- shard index ------------------------------------------------------------------


@pytest.mark.parametrize("entry", [(10**6, 48), (0, 2**40), (8, 2**64 - 1)])
def test_a_shard_index_pointing_out_of_bounds_is_a_bad_chunk(tmp_path: Path, entry: tuple[int, int]) -> None:
    path = tmp_path / "s.zarr"
    data = _write(path, "sharded")
    g, _ = _open(path, "sharded")
    target = _key_file(path, g, 2, 0)
    blob = target.read_bytes()
    # 2x2 inner chunks: an index of four (offset, length) uint64 pairs plus its crc32c, at the shard's end
    n_index = 4 * 16 + 4
    index = np.frombuffer(blob[-n_index:-4], dtype="<u8").reshape(4, 2).copy()
    index[1] = entry
    body = index.tobytes()
    # a valid checksum over the hostile index, so the bounds check itself must catch it
    target.write_bytes(blob[:-n_index] + body + struct.pack("<I", crc32c.crc32c(body)))
    why = "half empty" if entry[1] == 2**64 - 1 else "points outside the shard"
    # entry 1 of the shard's 2x1x2 grid of inner chunks: sample-axis chunk 2, tile 1; only it is bad
    assert g.tile_key(g.physical_chunk_coord(2, 1))[1] == (0, 0, 1)
    _expect_bad(path, "sharded", g, 2, 1, why)
    _expect_nan_tile(path, "sharded", data, g, 2, 1)


# --- metadata that disagrees with the chunks --------------------------------------


def _edit_v3_metadata(path: Path, name: str, **changes) -> None:
    meta_file = path / name / "zarr.json"
    meta = json.loads(meta_file.read_text())
    for key, value in changes.items():
        if key == "chunk_shape":
            meta["chunk_grid"]["configuration"]["chunk_shape"] = value
        else:
            meta[key] = value
    meta_file.write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["zstd", "raw"])
@pytest.mark.parametrize("change", [{"data_type": "float64"}, {"data_type": "int16"}, {"chunk_shape": [4, 4, 6]}])
def test_metadata_whose_dtype_or_chunks_disagree_with_the_bytes(tmp_path: Path, name: str, change: dict) -> None:
    path = tmp_path / "m.zarr"
    _write(path, name)
    _edit_v3_metadata(path, name, **change)
    g, manifest = _open(path, name)
    with InSituDataset(str(path), manifest, [name], batch_size=BATCH_SIZE, shuffle=False) as ds:
        with pytest.raises(
            BadChunkError, match=rf"chunk \(0, 0, [01]\) of array '{name}' \(key '{name}/c/0/0/[01]'\).*expected"
        ):
            next(iter(ds.train))


def test_v2_metadata_whose_dtype_disagrees_with_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "m2.zarr"
    _write(path, "blosc")
    meta_file = path / "blosc" / ".zarray"
    meta = json.loads(meta_file.read_text())
    meta["dtype"] = "<f8"
    meta_file.write_text(json.dumps(meta))
    g, manifest = _open(path, "blosc")
    with InSituDataset(str(path), manifest, ["blosc"], batch_size=BATCH_SIZE, shuffle=False) as ds:
        with pytest.raises(
            BadChunkError, match=r"chunk \(0, 0, [01]\) of array 'blosc' \(key 'blosc/0\.0\.[01]'\).*expected"
        ):
            next(iter(ds.train))


# --- absurd metadata: refused before allocation -----------------------------------


def _absurd(path: Path, name: str, shape, chunks, shards=None, dtype="f4") -> None:
    """Write metadata only: no chunk exists, so only a reader that believes the metadata allocates."""
    root = zarr.open_group(path, mode="a")
    root.create_array(name, shape=shape, chunks=chunks, shards=shards, dtype=dtype, fill_value=0)


@pytest.mark.parametrize(
    "shape, chunks, shards, dtype, why",
    [
        ((8, 10**6, 10**6), (1, 10**6, 10**6), None, "f4", r"one stored chunk decodes to 4000000000000 bytes"),
        ((8, 4, 4), (1, 10**6, 10**6), None, "f8", r"one stored chunk decodes to 8000000000000 bytes"),
        ((8, 10**7, 10**6), (8, 1000, 1000), None, "u1", r"one sample-axis chunk decodes to 80000000000000 bytes"),
        (
            (4, 2048, 1024),
            (1, 1, 1),
            None,
            "u1",
            rf"has 2097152 tiles per sample-axis chunk, over the limit of {MAX_CHUNKS_PER_READ}",
        ),
        ((4, 2048, 1024), (1, 1, 1), (1, 2048, 1024), "u1", r"has 2097152 inner chunks per shard"),
    ],
)
def test_absurd_metadata_is_refused_before_any_big_allocation(tmp_path, shape, chunks, shards, dtype, why) -> None:
    path = tmp_path / "a.zarr"
    root = zarr.open_group(path, mode="w")
    write_array(root, "ok", np.zeros((8, 2), "f4"), (2, 2))
    _absurd(path, "huge", shape, chunks, shards, dtype)
    manifest = split_by_chunk(open_geometries(str(path), variables=["ok"])["ok"], fractions=(1.0,))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(ValueError, match=rf"array 'huge' .*{why}"):
        open_geometries(str(path))
    with pytest.raises(ValueError, match=rf"array 'huge' .*{why}"):
        InSituDataset(str(path), manifest)  # variables=None finds every data variable
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak < RSS_SLACK_BYTES


def test_the_chunk_byte_limit_is_overridable(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "l.zarr"
    data = _write(path, "zstd")
    chunk_bytes = 4 * 4 * 6 * 4  # a sample-axis chunk of both tiles
    with pytest.raises(ValueError, match=rf"over max_chunk_bytes={chunk_bytes - 1}.*INSITUBATCH_MAX_CHUNK_BYTES"):
        open_geometries(str(path), max_chunk_bytes=chunk_bytes - 1)
    assert open_geometries(str(path), max_chunk_bytes=chunk_bytes)["zstd"].chunk_nbytes == chunk_bytes
    monkeypatch.setenv("INSITUBATCH_MAX_CHUNK_BYTES", str(chunk_bytes - 1))
    with pytest.raises(ValueError, match=rf"over max_chunk_bytes={chunk_bytes - 1}"):
        open_geometries(str(path))
    assert open_geometries(str(path), max_chunk_bytes=MAX_CHUNK_BYTES)  # a per-call limit wins
    monkeypatch.delenv("INSITUBATCH_MAX_CHUNK_BYTES")
    _iterate(path, "zstd", data)


# --- on_bad_chunk="nan" covers decode failures only ---------------------------------


def test_nan_policy_covers_decode_failures_but_a_store_outage_still_raises(tmp_path: Path) -> None:
    path = tmp_path / "o.zarr"
    _write(path, "zstd")
    g, manifest = _open(path, "zstd")
    _key_file(path, g, 1, 0).write_bytes(b"not zstd at all")
    store = CountingStore(local_store(path))
    outage = g.chunk_key(g.physical_chunk_coord(4, 1))
    store.fail_keys = {outage}
    with InSituDataset(store, manifest, ["zstd"], batch_size=BATCH_SIZE, shuffle=False, on_bad_chunk="nan") as ds:
        with pytest.raises(StoreReadError, match=rf"array 'zstd' chunk \(4, 0, 1\) \(key '{outage}'\)"):
            for _ in ds.train:
                pass
        assert [(r.array, r.chunk_index) for r in ds.bad_chunks] == [("zstd", 1)]
