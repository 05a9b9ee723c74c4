"""describe() states the GETs a cold pass sends, and the pass sends exactly those; every fetched byte is counted.

Sharded arrays included: each shard's index (one GET per shard, whether read
as the dataset opens or in the pass) and the inner chunks one block wants
of one shard that lie back to back (one GET per run). Checked over a local
directory and over the loopback emulator, whose own counters are the
ground truth for the bytes.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.reads import shard_index
from insitubatch._engine.reads.shard_index import held_index_bytes, plan_shards
from insitubatch._engine.reads.shard_runs import MAX_RUN_TILES, coalesce, morton_ranks, run_cap
from insitubatch.io.decode import shard_stage

SHAPE = (96, 16, 20)
INNER = (4, 8, 10)  # 2 x 2 inner chunks per step band
SHARD = (16, 16, 20)  # 4 bands x 4 = 16 inner chunks per shard
DIMS = ("time", "lat", "lon")


def _write(root, name: str = "s.zarr") -> None:
    group = zarr.open_group(root / name, mode="w", zarr_format=3)
    rng = np.random.default_rng(0)
    for array, shards in (("a", SHARD), ("b", None)):
        group.create_array(
            array,
            shape=SHAPE,
            chunks=INNER,
            shards=shards,
            dtype="f4",
            dimension_names=("time", "lat", "lon"),
        )[...] = rng.random(SHAPE, dtype="f4")


@pytest.fixture(params=["local", "emulator"])
def where(request, tmp_path):
    """``(url, emulator or None)`` of the same sharded group."""
    if request.param == "local":
        _write(tmp_path)
        return str(tmp_path / "s.zarr"), None
    emulator = request.getfixturevalue("emulator")
    _write(emulator.root)
    return emulator.url_for("s.zarr"), emulator


VARIABLES = {
    "sharded": lambda g: {"a": g["a"]},
    "sharded+plain": lambda g: {"a": g["a"], "b": g["b"]},
    "plain": lambda g: {"b": g["b"]},
    "selection": lambda g: {"x": g["a"].isel(lat=slice(0, 8)), "y": g["a"].isel(lon=slice(12, 20))},
    # two selections of an unsharded array whose tiles overlap: a shared tile is one GET
    "overlapping": lambda g: {"x": g["b"].isel(lat=slice(0, 8)), "y": g["b"].isel(lon=slice(12, 20))},
}


def _served(emulator) -> tuple[int, int]:
    """GETs and bytes the server answered for the arrays' chunks so far (not the metadata, nor its 404s)."""
    chunks = {k: v for k, v in emulator.stats().keys.items() if "/c/" in k}
    return sum(v.gets for v in chunks.values()), sum(v.bytes_sent for v in chunks.values())


@pytest.mark.parametrize("variables", list(VARIABLES))
@pytest.mark.parametrize(
    "split, block_chunks, max_inflight",
    [("train", 2, "auto"), ("val", 4, "auto"), ("val", 4, 3)],  # val is sequential: a block is a whole shard
)
def test_a_cold_pass_sends_the_gets_describe_states(where, variables, split, block_chunks, max_inflight) -> None:
    url, emulator = where
    store = obstore_store(url, read_only=True)
    geoms = open_geometries(store, variables=["a", "b"])
    manifest = split_by_chunk(geoms["a"], fractions=(0.5, 0.5))
    knobs = {"batch_size": 8, "block_chunks": block_chunks, "max_inflight": max_inflight, "hedge": False}
    if emulator is not None:
        emulator.reset_stats()
    with InSituDataset(store, manifest, VARIABLES[variables](geoms), **knobs) as ds:
        info = ds.describe()
        opened = _served(emulator) if emulator is not None else (0, 0)
        predicted = info["splits"][split]
        samples = sum(len(b) for b in ds.split(split))
        assert samples == len(manifest.sample_indices(split))
        sent = ds.split(split).last_pass
        assert sent.gets == predicted["gets"]  # the pass counts every read it caused, its indexes included
        # a remote dataset reads train's first shard indexes as it opens (the likely first pass): apart
        assert ds.gets == sent.gets + info["open"]["gets"]
    if emulator is None:
        assert info["open"] == {"gets": 0, "bytes": 0, "split": None}  # a local store: nothing read ahead
        return
    # the server's own counts: the open's reads before the constructor returned, then exactly the pass's
    assert opened == (info["open"]["gets"], info["open"]["bytes"])
    total = _served(emulator)
    assert (total[0] - opened[0], total[1] - opened[1]) == (predicted["gets"], sent.get_bytes)


def test_a_block_released_read_by_read_leaves_which_inner_chunks_share_a_get_to_the_plan(where, monkeypatch) -> None:
    """The producer lets go of a block's reads one unpin at a time; a driver that finds room after the first
    must not start the half of a shard's reads it has admitted by then (they would share fewer GETs)."""
    from insitubatch._engine.pool.chunk_pool import ChunkPool

    unpin = ChunkPool.unpin

    def slow_unpin(self, entry, owner) -> None:
        unpin(self, entry, owner)
        time.sleep(0.02)  # the driver re-checks for room between two unpins of one block

    monkeypatch.setattr(ChunkPool, "unpin", slow_unpin)
    url, _ = where
    store = obstore_store(url, read_only=True)
    geoms = open_geometries(store, variables=["a"])
    manifest = split_by_chunk(geoms["a"], fractions=(0.5, 0.5))
    # val: three blocks of one shard each; two blocks fill the working set, so the third waits for the first
    with InSituDataset(store, manifest, {"a": geoms["a"]}, batch_size=8, block_chunks=4, max_inflight=3) as ds:
        predicted = ds.describe()["splits"]["val"]["gets"]
        assert sum(len(b) for b in ds.val) == len(manifest.sample_indices("val"))
        assert ds.val.last_pass.budget_wait_s > 0  # it did wait for the first block's release
        assert ds.val.last_pass.gets == predicted


def test_adjacent_inner_chunks_of_a_block_share_gets_and_the_count_says_so(where) -> None:
    """val read in blocks of one shard: the shard's 16 inner chunks lie back to back, so fewer GETs than tiles."""
    url, _ = where
    store = obstore_store(url, read_only=True)
    geoms = open_geometries(store, variables=["a"])
    manifest = split_by_chunk(geoms["a"], fractions=(0.5, 0.5))
    with InSituDataset(store, manifest, {"a": geoms["a"]}, batch_size=8, block_chunks=4) as ds:
        gets = ds.describe()["splits"]["val"]["gets"]
        tiles = len(manifest.chunks("val")) * geoms["a"].tiles_read
        shards = tiles // 16
        if url.startswith("http"):
            assert gets == shards + shards * -(-16 // run_cap(ds.context.permits().cap))  # runs of a whole shard
        else:
            assert gets == shards + tiles  # a local store reads inner chunks one by one
        for _ in ds.val:
            pass
        assert ds.val.last_pass.gets == gets  # (the indexes read at open are train's shards, not val's)


@pytest.mark.parametrize("per_shard", [(4, 2, 3), (4, 2, 2), (3, 5), (1, 4, 1), (2, 3, 4), (8,)])
def test_the_layout_model_matches_shards_zarr_wrote(tmp_path, per_shard) -> None:
    """The inner chunks' order in a shard zarr-python wrote (by their offsets) is the model's (any zarr version)."""
    inner = (2, 3, 3)[: len(per_shard)]
    shape = tuple(n * c for n, c in zip(per_shard, inner))
    root = zarr.open_group(tmp_path / "l.zarr", mode="w", zarr_format=3)
    arr = root.create_array(
        "v",
        shape=shape,
        chunks=shape,
        dtype="f4",
        serializer=ShardingCodec(chunk_shape=inner, codecs=[BytesCodec(), ZstdCodec()]),
        compressors=None,
    )
    arr[...] = np.random.default_rng(1).random(shape, dtype="f4")
    from insitubatch.io.decode import shard_stage
    from insitubatch.io.group import open_geometries as geometries

    g = geometries(str(tmp_path / "l.zarr"))["v"]
    raw = (tmp_path / "l.zarr" / "v" / "c" / "/".join("0" * len(shape))).read_bytes()
    offsets, _, _ = shard_stage(g).read_index(np.frombuffer(raw[-shard_stage(g).index_nbytes :], dtype=np.uint8))
    by_offset = np.argsort(offsets.ravel(), kind="stable")
    assert np.array_equal(np.argsort(morton_ranks(per_shard).ravel(), kind="stable"), by_offset)


def test_runs_are_capped_and_only_touching_spans_join() -> None:
    spans = [(i, i + 1) for i in range(40)] + [(41, 42)]
    runs = coalesce(spans, cap=MAX_RUN_TILES)
    assert [len(r) for r in runs] == [16, 16, 8, 1]
    assert [len(r) for r in coalesce(spans[:5], cap=run_cap(2))] == [2, 2, 1]


@pytest.mark.parametrize("order", [("train", "val"), ("val", "train")])
@pytest.mark.parametrize("held_shards", [None, 2], ids=["all-held", "two-held"])
@pytest.mark.parametrize("variables", ["sharded+plain", "selection"])
def test_each_split_sends_what_describe_states_in_either_order(where, monkeypatch, order, held_shards, variables):
    """A shard train and val share (a 0.6 split) is read by each; with room for two shards' indexes a split lets
    them go and reads them again: describe() states each pass's GETs whichever split ran first."""
    url, emulator = where
    store = obstore_store(url, read_only=True)
    geoms = open_geometries(store, variables=["a", "b"])
    if held_shards is not None:
        each = held_index_bytes(shard_stage(geoms["a"]))
        monkeypatch.setattr(shard_index, "SHARD_INDEX_BUDGET_BYTES", held_shards * each)
    manifest = split_by_chunk(geoms["a"], fractions=(0.6, 0.4))
    knobs = {"batch_size": 8, "block_chunks": 2, "max_inflight": 4, "hedge": False}
    if emulator is not None:
        emulator.reset_stats()
    with InSituDataset(store, manifest, VARIABLES[variables](geoms), **knobs) as ds:
        info = ds.describe()
        served = [_served(emulator)] if emulator is not None else []
        for split in order:
            for _ in ds.split(split):
                pass
            sent = ds.split(split).last_pass
            assert sent.gets == info["splits"][split]["gets"], split
            if emulator is not None:
                served.append(_served(emulator))
                gets, nbytes = (a - b for a, b in zip(served[-1], served[-2]))
                assert (gets, nbytes) == (sent.gets, sent.get_bytes), split
        shards = {s: len({k for k, _ in _wanted(ds, s)}) for s in order}
        reread = {s: info["splits"][s]["index_gets"] - shards[s] for s in order}
        assert (
            ds.context.shard_indexes.gets
            == sum(info["splits"][s]["index_gets"] for s in order) + (info["open"]["gets"])
        )
    if emulator is not None:
        assert served[0] == (info["open"]["gets"], info["open"]["bytes"])
    held = info["memory"]["shard_index_bytes"]
    if held_shards is None:
        assert all(r <= 0 for r in reread.values())  # each index once (train's first ones read as it opened)
    else:
        assert reread["train"] > 0  # a shuffled pass came back to shards it had let go
        assert held == len(manifest.names) * held_shards * held_index_bytes(shard_stage(geoms["a"]))


def _wanted(ds, split: str):
    readers = {s: r for s, r in ds.context.readers.items() if r.geometry.sharded_reads}
    stages = {r.geometry.path: shard_stage(r.geometry) for r in readers.values()}
    return plan_shards(ds.plan(split), readers, stages, 0)


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("variables", ["sharded+plain", "selection", "plain"])
def test_where_no_codec_compresses_describe_states_the_bytes_too(tmp_path, request, split, variables) -> None:
    """Stored uncompressed, every tile's size is fixed: describe() states
    the bytes each split's cold pass moves, and the server sends exactly those; compressed, it says None."""
    emulator = request.getfixturevalue("emulator")
    group = zarr.open_group(emulator.root / "r.zarr", mode="w", zarr_format=3)
    rng = np.random.default_rng(2)
    for array, shards in (("a", SHARD), ("b", None)):
        group.create_array(
            array, shape=SHAPE, chunks=INNER, shards=shards, dtype="f4", compressors=None, dimension_names=DIMS
        )[...] = rng.random(SHAPE, dtype="f4")
    group.create_array("c", shape=SHAPE, chunks=INNER, dtype="f4", dimension_names=DIMS)[...] = 1.0  # zstd
    for url in (str(emulator.root / "r.zarr"), emulator.url_for("r.zarr")):
        store = obstore_store(url, read_only=True)
        geoms = open_geometries(store, variables=["a", "b", "c"])
        manifest = split_by_chunk(geoms["a"], fractions=(0.5, 0.5))
        emulator.reset_stats()
        with InSituDataset(store, manifest, VARIABLES[variables](geoms), batch_size=8, block_chunks=2) as ds:
            info = ds.describe()
            opened = _served(emulator)
            for _ in ds.split(split):
                pass
            sent = ds.split(split).last_pass
            assert (sent.gets, sent.get_bytes) == (info["splits"][split]["gets"], info["splits"][split]["bytes"])
            with InSituDataset(store, manifest, {"c": geoms["c"]}, batch_size=8) as compressed:
                assert compressed.describe()["splits"][split]["bytes"] is None
        if url.startswith("http"):
            total = _served(emulator)
            assert opened == (info["open"]["gets"], info["open"]["bytes"])
            assert (total[0] - opened[0], total[1] - opened[1]) == (sent.gets, sent.get_bytes)
