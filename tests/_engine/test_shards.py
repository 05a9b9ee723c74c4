"""Partial shard reads: inner chunks fetched by byte range after a once-read index, equal to zarr, counted on the wire."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.errors import ZarrUserWarning

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.reads.shard_index import (
    HELD_ENTRY_BYTES,
    HELD_INDEX_OVERHEAD_BYTES,
    SHARD_INDEX_BUDGET_BYTES,
)
from insitubatch._engine.reads.shard_runs import coalesce
from insitubatch._engine.reads.store_link import client_for
from insitubatch.io.decode import shard_stage
from insitubatch.testing.emulator import Emulator

SHAPE = (37, 10, 12)  # 37 steps: the last shard is partial


def _write(path, *, index_location="end", holes=False, nested=False, shards=(8, 10, 12), chunks=(2, 5, 6)):
    """A sharded v3 array ``v`` of SHAPE (and zarr's read of it): index at ``index_location``, optional holes/nesting."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal(SHAPE).astype("f4")
    if holes:  # inner chunks of fill value are never written: their index entries are absent
        data[2:4] = 0.0
        data[10:12, :5, 6:] = 0.0
    root = zarr.open_group(path, mode="w")
    inner_codecs = [BytesCodec(), ZstdCodec()]
    if nested:
        inner_codecs = [ShardingCodec(chunk_shape=(1, 5, 3), codecs=[BytesCodec(), ZstdCodec()])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)  # nesting: zarr warns about partial reads it cannot do
        arr = root.create_array(
            "v",
            shape=SHAPE,
            chunks=shards,
            dtype="f4",
            fill_value=0.0,
            serializer=ShardingCodec(chunk_shape=chunks, codecs=inner_codecs, index_location=index_location),
            compressors=None,  # nothing outside the sharding codec: inner chunks can be read alone
            dimension_names=("time", "y", "x"),
        )
        arr[...] = data
    return zarr.open_array(path / "v", mode="r")[...]


def _epoch(store, *, selection=None, **kw) -> list:
    g = open_geometries(store)["v"]
    view = g if selection is None else g.isel(selection)
    manifest = split_by_chunk(g, fractions=(1.0,))
    out = []
    with InSituDataset(store, manifest, {"v": view}, batch_size=5, block_chunks=3, **kw) as ds:
        for batch in ds.train:
            out.append((batch.sample_indices.copy(), batch.arrays["v"].copy()))
    return out


@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("holes", [False, True], ids=["full", "holes"])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_every_batch_equals_zarr(tmp_path, index_location, holes, nested) -> None:
    path = tmp_path / "s.zarr"
    data = _write(path, index_location=index_location, holes=holes, nested=nested)
    g = open_geometries(str(path))["v"]
    assert g.sharded_reads and g.sample_chunk_size == 2 and g.n_chunks == 19
    for store in (str(path), CountingStore(local_store(path))):  # synchronous reads, and the async path
        seen = 0
        for indices, values in _epoch(store, selection={2: slice(None, None, -1)}):
            np.testing.assert_array_equal(values, data[indices][:, :, ::-1])
            seen += len(indices)
        assert seen == SHAPE[0]


def _needed(path, selection_tiles):
    """Per shard key: the byte spans of the inner chunks a pass needs, and the index's size."""
    g = open_geometries(str(path))["v"]
    stage = shard_stage(g)
    spans: dict[str, list[tuple[int, int]]] = {}
    for c in range(g.n_chunks):
        for t in selection_tiles(g):
            key, place = g.tile_key(g.physical_chunk_coord(c, t))
            blob = (path / key).read_bytes()
            offsets, lengths, _ = stage.read_index(np.frombuffer(blob[-stage.index_nbytes :], dtype=np.uint8))
            spans.setdefault(key, []).append((int(offsets[place]), int(lengths[place])))
    return spans, stage.index_nbytes


@pytest.mark.parametrize(
    ("selection", "tiles"),
    [(None, lambda g: range(g.tiles_per_chunk)), ({1: slice(0, 5), 2: slice(6, 12)}, lambda g: [1])],
    ids=["whole field", "one tile"],
)
@pytest.mark.invariant
def test_the_wire_carries_the_inner_chunks_needed_and_one_index_per_shard(tmp_path, selection, tiles) -> None:
    path = tmp_path / "s.zarr"
    data = _write(path)
    spans, index_nbytes = _needed(path, tiles)
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("s.zarr"), read_only=True)
        geoms = open_geometries(store, variables=["v"])
        emu.reset_stats()
        view = geoms["v"] if selection is None else geoms["v"].isel(selection)
        with InSituDataset(store, split_by_chunk(geoms["v"], fractions=(1.0,)), {"v": view}, batch_size=5) as ds:
            for batch in ds.train:
                want = data[batch.sample_indices]
                if selection is not None:
                    want = want[:, 0:5, 6:12]
                np.testing.assert_array_equal(batch.arrays["v"], want)
        stats = emu.stats()
    for key, needed in spans.items():
        got = stats.keys[f"s.zarr/{key}"]
        assert got.bytes_sent == sum(n for _, n in needed) + index_nbytes, key
        assert got.gets <= len(needed) + 1, key  # one index, then at most one GET per inner chunk
    untouched = [k for k in stats.keys if k.startswith("s.zarr/v/c/") and k[len("s.zarr/") :] not in spans]
    assert untouched == []


def test_the_auto_window_learns_from_inner_chunks_and_only_counts_the_indexes(tmp_path) -> None:
    """An index read holds a place in the window, and moves a few bytes: the controller must not take the
    bytes/s of a window full of them for what the link moves."""
    data = _write(tmp_path / "s.zarr")
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("s.zarr"), read_only=True)
        geoms = open_geometries(store, variables=["v"])
        controller = client_for(store).link.controller
        before = controller.side_reads  # (the dataset reads its first indexes as it opens)
        with InSituDataset(store, split_by_chunk(geoms["v"], fractions=(1.0,)), geoms, batch_size=5) as ds:
            assert ds.context.permits().window.controller is controller
            for batch in ds.train:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
            indexes = ds.context.shard_indexes.gets
            assert indexes == -(-SHAPE[0] // 8)  # one per shard
            assert controller.side_reads - before == indexes


def test_describe_names_the_shards_and_their_inner_chunks(tmp_path) -> None:
    path = tmp_path / "s.zarr"
    _write(path)
    g = open_geometries(str(path))["v"]
    with InSituDataset(str(path), split_by_chunk(g, fractions=(1.0,)), {"v": g}) as ds:
        info = ds.describe()
    row = info["variables"]["v"]
    assert row["stored_chunk"] == [8, 10, 12] and row["read_chunk"] == [2, 5, 6] and row["shard_reads"]
    # every shard's index, an entry per inner chunk of its grid (4 x 2 x 2), the last shard's past the array too
    assert info["memory"]["shard_index_bytes"] == 5 * (HELD_ENTRY_BYTES * 4 * 2 * 2 + HELD_INDEX_OVERHEAD_BYTES)
    assert info["memory"]["shard_index_budget_bytes"] == SHARD_INDEX_BUDGET_BYTES  # each split's at most
    assert any("is sharded: its tiles are inner chunks (2, 5, 6) of shards (8, 10, 12)" in n for n in info["notes"])


def test_adjacent_inner_chunks_come_in_one_get(tmp_path) -> None:
    """A sample chunk's tiles lie back to back in its shard: one ranged GET reads them all, nothing more."""
    path = tmp_path / "s.zarr"
    data = _write(path)
    spans, index_nbytes = _needed(path, lambda g: range(g.tiles_per_chunk))
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("s.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        emu.reset_stats()
        manifest = split_by_chunk(g, fractions=(1.0,))
        with InSituDataset(store, manifest, ["v"], batch_size=5, max_inflight=64) as ds:
            for batch in ds.train:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
        stats = emu.stats()
    for key, needed in spans.items():  # no gap read and thrown away
        assert stats.keys[f"s.zarr/{key}"].bytes_sent == sum(n for _, n in needed) + index_nbytes, key
    inner = sum(len(needed) for needed in spans.values())
    gets = sum(stats.keys[f"s.zarr/{key}"].gets for key in spans)
    # zarr lays a shard's inner chunks out in Morton order (the sample axis fastest): the tiles of
    # neighbouring sample chunks touch, and chunks wanted together are read in runs
    assert gets <= len(spans) + 2 * inner // 3, (gets, inner)  # (one GET per inner chunk: len(spans) + inner)


def test_coalesce_joins_only_touching_spans() -> None:
    runs = coalesce([(30, 40, "c", 2), (0, 10, "a", 0), (10, 30, "b", 1), (41, 50, "d", 3)])
    assert [[s[2] for s in run] for run in runs] == [["a", "b", "c"], ["d"]]
