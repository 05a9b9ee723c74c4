"""The engine's per-tile paths: which stores are read on the decode thread, and each path against zarr."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import obstore.store
import pytest
import zarr
from helpers import CountingStore, assert_batch_matches, smooth_field, write_array
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore, ObjectStore

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._zarr_compat import sync
from insitubatch.errors import BadChunkError
from insitubatch.io.sync_get import sync_get
from insitubatch.transforms import DecodedChunk, applies

SHAPE = (30, 6, 10)
# 5 samples per chunk, inner tiles 2 x 2 with short edge tiles
CHUNKS = (5, 4, 6)


@pytest.fixture
def tiled(tmp_path: Path) -> tuple[Path, np.ndarray]:
    root = zarr.open_group(tmp_path / "t.zarr", mode="w")
    data = smooth_field(np.random.default_rng(7), SHAPE)
    write_array(root, "v", data, CHUNKS)
    return tmp_path / "t.zarr", data


def _stores(path: Path) -> dict[str, object]:
    memory = MemoryStore()
    for f in path.rglob("*"):
        if f.is_file():
            key = f.relative_to(path).as_posix()
            sync(memory.set(key, default_buffer_prototype().buffer.from_bytes(f.read_bytes())))
    return {
        "zarr-local": LocalStore(path, read_only=True),
        "obstore-local": obstore_store(str(path), read_only=True),
        "zarr-memory": memory,
        "wrapped": CountingStore(LocalStore(path, read_only=True)),
    }


def test_sync_reads_only_where_the_store_offers_them(tiled, tmp_path: Path) -> None:
    path, _ = tiled
    stores = _stores(path)
    assert sync_get(stores["zarr-local"]) is not None
    assert sync_get(stores["zarr-memory"]) is not None
    assert sync_get(stores["obstore-local"]) is not None
    assert sync_get(ObjectStore(obstore.store.MemoryStore())) is not None
    # a wrapper that overrides get (counting, failing, delaying) must see every read
    assert sync_get(stores["wrapped"]) is None
    # a network store keeps the async path: a blocking read would hold a decode thread
    assert sync_get(ObjectStore(obstore.store.HTTPStore.from_url("http://127.0.0.1:9"))) is None


@pytest.mark.parametrize("key", ["v/c/0/0/0", "v/zarr.json", "v/c/9/9/9", "v", "v/c/../c/0/0/0", "odd name%/x"])
def test_local_files_read_what_obstore_reads(tiled, key: str) -> None:
    path, _ = tiled
    store = obstore_store(str(path), read_only=True)
    proto = default_buffer_prototype()
    try:
        want = sync(store.get(key, prototype=proto))
    except Exception as exc:  # obstore refuses some paths outright: the sync read must refuse them too
        with pytest.raises(type(exc)):
            sync_get(store)(key, prototype=proto)
        return
    got = sync_get(store)(key, prototype=proto)
    assert (got is None) == (want is None)
    if want is not None:
        assert _bytes(got) == want.to_bytes()


def _bytes(data) -> bytes:
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(memoryview(data))


def test_local_files_reuse_one_buffer_per_thread_and_read_every_size(tmp_path: Path) -> None:
    sizes = [10, 5000, 3, 70_000, 0, 69_999]
    payloads = [np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    for n, payload in zip(sizes, payloads):
        (tmp_path / f"k{n}").write_bytes(payload)
    read = sync_get(obstore_store(str(tmp_path), read_only=True))
    proto = default_buffer_prototype()
    views = []
    for n, payload in zip(sizes, payloads):
        got = read(f"k{n}", prototype=proto)
        assert _bytes(got) == payload  # exactly the file, whatever was read before
        views.append(got)
    # no allocation per key once the buffer is big enough: the 70 000 and 69 999 byte reads share memory
    assert np.shares_memory(views[3], views[5])


def test_local_files_read_a_file_that_grew_since_its_size_was_taken(tmp_path: Path, monkeypatch) -> None:
    payload = bytes(range(256)) * 40
    (tmp_path / "grown").write_bytes(payload)
    import insitubatch.stores.local_files as local_files

    real_fstat = local_files.os.fstat

    class _Stat:
        def __init__(self, st):
            self.st_size = st.st_size // 2  # as if the writer appended after fstat

    monkeypatch.setattr(local_files.os, "fstat", lambda fd: _Stat(real_fstat(fd)))
    got = sync_get(obstore_store(str(tmp_path), read_only=True))("grown", prototype=default_buffer_prototype())
    assert _bytes(got) == payload  # never truncated to the stale size


def _double(c: DecodedChunk) -> DecodedChunk:
    return DecodedChunk(c.read, c.data * 2, c.sample_offset)


@pytest.mark.parametrize("store_kind", ["zarr-local", "obstore-local", "zarr-memory", "wrapped"])
@pytest.mark.parametrize("assemble", [False, True])
@pytest.mark.parametrize("max_inflight", [1, 3, 32])
def test_every_path_matches_zarr(tiled, store_kind: str, assemble: bool, max_inflight: int) -> None:
    path, data = tiled
    store = _stores(path)[store_kind]
    g = open_geometries(store)["v"]
    assert g.tiles_per_chunk == 4
    manifest = split_by_chunk(g, fractions=(1.0,))
    kw = {"chunk_transforms": [applies("v", _double)]} if assemble else {}
    expected = data * 2 if assemble else data
    with InSituDataset(store, manifest, ["v"], batch_size=4, block_chunks=2, max_inflight=max_inflight, **kw) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            ds.pool.clear()  # every epoch cold: each tile read and decoded again
            seen = []
            it = iter(ds.train)
            for batch in it:
                assert_batch_matches(batch, ds.variables, {"v": expected})
                seen += batch.sample_indices.tolist()
            assert sorted(seen) == list(range(SHAPE[0]))
            n_tiles = (SHAPE[0] // CHUNKS[0]) * g.tiles_per_chunk
            assert (it.counters.gets, it.counters.decoded_tiles) == (n_tiles, n_tiles)
            assert it.counters.get_bytes == sum(
                (path / g.chunk_key(g.physical_chunk_coord(c, t))).stat().st_size
                for c in range(SHAPE[0] // CHUNKS[0])
                for t in range(4)
            )


@pytest.mark.parametrize("store_kind", ["zarr-local", "obstore-local", "wrapped"])
@pytest.mark.parametrize("assemble", [False, True])
@pytest.mark.parametrize("tile", [0, 3])  # a full tile (decoded in place) and the short far-corner one
def test_bad_tile_is_refused_or_filled_exactly_there(tiled, store_kind: str, assemble: bool, tile: int) -> None:
    path, data = tiled
    g = open_geometries(str(path))["v"]
    chunk = 2
    key = g.chunk_key(g.physical_chunk_coord(chunk, tile))
    blob = (path / key).read_bytes()
    (path / key).write_bytes(blob[: len(blob) // 2])  # a body cut off mid-transfer
    store = _stores(path)[store_kind]
    manifest = split_by_chunk(g, fractions=(1.0,))
    kw = {"chunk_transforms": [applies("v", _double)]} if assemble else {}
    with InSituDataset(store, manifest, ["v"], batch_size=4, block_chunks=2, **kw) as ds:
        with pytest.raises(BadChunkError, match=re.escape(f"chunk {g.physical_chunk_coord(chunk, tile)} of array 'v'")):
            list(ds.train)
    expected = (data * 2 if assemble else data).copy()
    (y, x), (h, w) = g.tile_origins()[tile], g.tile_shapes()[tile]
    expected[chunk * 5 : chunk * 5 + 5, y : y + h, x : x + w] = np.nan
    with InSituDataset(store, manifest, ["v"], batch_size=4, block_chunks=2, on_bad_chunk="nan", **kw) as ds:
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, {"v": expected})
        assert [(r.array, r.chunk_index, r.inner_coord) for r in ds.bad_chunks] == [("v", chunk, g.tile_coord(tile))]
