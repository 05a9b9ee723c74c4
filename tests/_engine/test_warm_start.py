"""A remote dataset plans its likely first pass as it opens and, sharded, reads that pass's first-block indexes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zarr
from helpers import shard_keys
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.passes import warm
from insitubatch._engine.reads.shard_index import plan_shards
from insitubatch._wire.backends import ObstoreBackend
from insitubatch._wire.engine_client import NativeBackend
from insitubatch.io.decode import shard_stage
from insitubatch.plan.planner import EpochPlanner
from insitubatch.testing.emulator import Emulator

SHAPE = (48, 10, 12)  # 24 chunks of 2 steps, 6 shards of 8 steps


def _write(path, *, sharded: bool = True) -> np.ndarray:
    data = np.random.default_rng(11).standard_normal(SHAPE).astype("f4")
    root = zarr.open_group(path, mode="w")
    if sharded:
        codec = ShardingCodec(chunk_shape=(2, 10, 12), codecs=[BytesCodec(), ZstdCodec()])
        arr = root.create_array("v", shape=SHAPE, chunks=(8, 10, 12), dtype="f4", serializer=codec, compressors=None)
    else:
        arr = root.create_array("v", shape=SHAPE, chunks=(2, 10, 12), dtype="f4")
    arr[...] = data
    return data


def _index_nbytes(g) -> int:
    return shard_stage(g).index_nbytes


def _first_block_shards(g, plan) -> set[str]:
    chunks = sorted({int(plan.reads[i][1]) for i in np.flatnonzero(plan.read_first == 0)})
    return {f"a.zarr/{k}" for k in shard_keys(g, range(g.tiles_per_chunk), chunks)}


def _shard_gets(emu: Emulator) -> dict[str, tuple[int, int]]:
    """``key: (GETs, bytes sent)`` for the shards of ``v`` the server answered."""
    return {k: (s.gets, s.bytes_sent) for k, s in emu.stats().keys.items() if k.startswith("a.zarr/v/c/")}


@pytest.mark.parametrize(("rank", "world_size"), [(None, None), (1, 2)], ids=["one rank", "rank 1 of 2"])
def test_the_first_blocks_indexes_are_read_while_the_dataset_opens(tmp_path, rank, world_size) -> None:
    data = _write(tmp_path / "a.zarr")
    with Emulator(tmp_path, latency_s=0.01, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        manifest = split_by_chunk(g, fractions=(0.75, 0.25))
        emu.reset_stats()
        with InSituDataset(
            store, manifest, {"v": g}, batch_size=2, block_chunks=2, seed=4, rank=rank, world_size=world_size
        ) as ds:
            warmup = ds.context.warmup
            assert warmup is not None
            warmup.future.result(10)
            expected = _first_block_shards(g, ds.plan("train"))
            opened = _shard_gets(emu)
            # only the first block's shards, and of each only its index
            assert set(opened) == expected and warmup.shards == len(expected)
            assert all(v == (1, _index_nbytes(g)) for v in opened.values()), opened
            assert ds.gets == len(expected)  # the warm-up's GETs count in the epoch's totals
            for batch in ds.train:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
            after = _shard_gets(emu)
            # the pass read no index the warm-up had read: one index GET per shard touched, all told
            assert ds.context.shard_indexes.gets == len(after)
    assert expected <= set(after) and all(after[k][0] >= 2 for k in expected)


def test_the_index_gets_are_sent_before_the_whole_pass_is_planned(tmp_path, monkeypatch) -> None:
    """Planning the whole pass holds the GIL: the first block's index GETs must be out before it starts."""
    _write(tmp_path / "a.zarr")
    sent: list[str] = []
    at_planning: list[int] = []
    plan = EpochPlanner.plan

    def counting(request):
        def counted(self, key, byte_range=None, *version):  # (an index read is versioned: it asks for the ETag)
            sent.append(key)
            return request(self, key, byte_range, *version)

        return counted

    def planned(self, split, epoch, history=()):
        at_planning.append(len(sent))
        return plan(self, split, epoch, history)

    for backend in (ObstoreBackend, NativeBackend):
        for name in ("request", "versioned"):
            monkeypatch.setattr(backend, name, counting(getattr(backend, name)))
    monkeypatch.setattr(EpochPlanner, "plan", planned)
    with Emulator(tmp_path, latency_s=0.5, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        with InSituDataset(store, split_by_chunk(g, fractions=(1.0,)), {"v": g}, batch_size=2, block_chunks=4) as ds:
            warmup = ds.context.warmup
            assert warmup is not None and warmup.future.done()  # the open waited for their answers, not the sending
            assert at_planning[0] == warmup.shards > 0


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_pass_started_while_the_warm_up_reads_waits_for_its_indexes(tmp_path, monkeypatch, split) -> None:
    """A warm-up slower than the open's wait lands while the first pass waits: the pass's GETs all come after."""
    monkeypatch.setattr(warm, "OPEN_WAIT_S", 0.0)
    data = _write(tmp_path / "a.zarr")
    with Emulator(tmp_path, latency_s=0.1, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        emu.reset_stats()
        manifest = split_by_chunk(g, fractions={"train": 0.5, "val": 0.5})
        with InSituDataset(store, manifest, {"v": g}, batch_size=2, block_chunks=2) as ds:
            it = iter(ds.split(split))  # at once: the warm-up's GETs are still out
            assert not ds.context.warmup.future.done()
            opened = ds.context.open_reads()
            for batch in it:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
            assert ds.context.warmup.future.done()
            predicted = ds.describe()["splits"][split]["gets"]
            assert ds.split(split).last_pass.gets == predicted  # the warm-up's reads are the open's, not the pass's
            assert ds.gets == predicted + opened["gets"]
            got = _shard_gets(emu)
    if split == "train":  # every inner chunk is needed: a shard's bytes on the wire are its file, index included
        assert len(got) == 3
        for key, (gets, sent) in got.items():
            assert gets >= 2 and sent == (tmp_path / key).stat().st_size, key


@pytest.mark.parametrize("first", ["val", "all"])
def test_a_wrong_guess_costs_no_read_twice(tmp_path, first) -> None:
    """Another view iterated first reads what it needs; train then reuses the indexes read at open."""
    data = _write(tmp_path / "a.zarr")
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        manifest = split_by_chunk(g, fractions={"train": 0.5, "val": 0.5})
        emu.reset_stats()
        with InSituDataset(store, manifest, {"v": g}, batch_size=3, block_chunks=2) as ds:
            ds.context.warmup.future.result(10)
            warmed = _shard_gets(emu)
            for view in (getattr(ds, first), ds.train):
                seen = np.concatenate([b.sample_indices for b in view])
                for batch in view:
                    np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
                assert len(seen) == len(np.unique(seen))
            shards = ds.context.shard_indexes
            # one index GET per shard each split touched: a split holds its own (``all`` shares train's shards)
            # (``all`` reads all six shards, then train its three again: the warm-up's among them)
            assert shards.gets == len(_shard_gets(emu)) + (3 if first == "all" else 0)
    assert warmed and all(gets == 1 for gets, _ in warmed.values())


def test_closing_stops_a_warm_up_that_has_not_landed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(warm, "OPEN_WAIT_S", 0.0)  # (the open would wait that long for answers that never come)
    _write(tmp_path / "a.zarr")
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        emu.configure(hold_key="a.zarr/v/c/*", hold_times=None)  # no shard answers, ever
        ds = InSituDataset(store, split_by_chunk(g, fractions=(1.0,)), {"v": g}, batch_size=2)
        warmup = ds.context.warmup
        assert warmup is not None and not warmup.future.done()
        t0 = time.perf_counter()
        ds.close()
        assert time.perf_counter() - t0 < 5.0
        assert warmup.future.cancelled()
        emu.configure(hold_key=None)


@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (2, 3)])
@pytest.mark.parametrize("split", ["train", "val"])
def test_the_first_block_alone_is_the_passs_first_block(tmp_path, split, rank, world_size) -> None:
    """What the warm-up reads from: the pass's own first block, planned without the rest of the pass."""
    _write(tmp_path / "a.zarr")
    store = zarr.storage.LocalStore(tmp_path / "a.zarr", read_only=True)
    g = open_geometries(store, variables=["v"])["v"]
    manifest = split_by_chunk(g, fractions=(0.7, 0.3))
    with InSituDataset(
        store, manifest, {"v": g}, batch_size=3, block_chunks=3, seed=9, rank=rank, world_size=world_size
    ) as ds:
        head, whole = ds.planner.first_block(split, 2), ds.plan(split, 2)
    assert head.n_blocks == 1 and whole.n_blocks > 1
    np.testing.assert_array_equal(head.order, whole.order[: whole.block_starts[1]])
    assert [head.reads[i] for i in head.block_reads[0]] == [whole.reads[i] for i in whole.block_reads[0]]


def test_a_pass_too_large_to_plan_in_moments_is_planned_when_it_starts(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(warm, "WARM_PLAN_READS", 17)  # train here: 18 chunks of one source
    _write(tmp_path / "a.zarr")
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        manifest = split_by_chunk(g, fractions=(0.75, 0.25))
        emu.reset_stats()
        with InSituDataset(store, manifest, {"v": g}, batch_size=2) as ds:
            assert ds.context.warmup is None and ds.planner._plans == {}
            assert _shard_gets(emu) == {}
            assert sum(len(b.sample_indices) for b in ds.train) == 36


@pytest.mark.parametrize("case", ["local store", "unsharded", "disk cache"])
def test_nothing_is_warmed_where_no_index_would_be_read_ahead(tmp_path, case) -> None:
    _write(tmp_path / "a.zarr", sharded=case != "unsharded")
    kw = {"cache_dir": tmp_path / "cache"} if case == "disk cache" else {}
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        where = str(tmp_path / "a.zarr") if case == "local store" else emu.url_for("a.zarr")
        store = zarr.storage.LocalStore(where, read_only=True) if case == "local store" else obstore_store(where)
        g = open_geometries(store, variables=["v"])["v"]
        emu.reset_stats()
        with InSituDataset(store, split_by_chunk(g, fractions=(1.0,)), {"v": g}, batch_size=2, **kw) as ds:
            assert ds.context.warmup is None
            assert _shard_gets(emu) == {}
            # a remote store's first pass was planned while the dataset opened; a local one's waits for its pass
            assert (("train", 0, ()) in ds.planner._plans) == (case != "local store")
            assert not [t for t in threading.enumerate() if t.name.startswith("insitu-open")]


def test_shards_are_read_ahead_in_first_use_by_block_across_variables(tmp_path) -> None:
    """The indexes a pass reads ahead come block by block, every variable's shards of one block before the next
    block's: one variable's whole pass first would leave the others' tiles to read theirs on demand."""
    root = zarr.open_group(tmp_path / "b.zarr", mode="w")
    codec = ShardingCodec(chunk_shape=(2, 10, 12), codecs=[BytesCodec()])
    for name in ("u", "w"):
        arr = root.create_array(name, shape=SHAPE, chunks=(8, 10, 12), dtype="f4", serializer=codec, compressors=None)
        arr[...] = 1
    store = zarr.storage.LocalStore(tmp_path / "b.zarr", read_only=True)
    geometries = open_geometries(store, variables=["u", "w"])
    manifest = split_by_chunk(geometries["u"], fractions=(1.0,))
    with InSituDataset(store, manifest, geometries, batch_size=2, block_chunks=2, seed=3) as ds:
        plan = ds.plan("train")
        readers = ds.context.readers
        stages = {r.geometry.path: shard_stage(r.geometry) for r in readers.values()}
        wanted = [key for key, _ in plan_shards(plan, readers, stages, 1)]
    per_shard = 8 // 2  # inner chunks (the pass's read unit) per shard

    def first_use(key: str) -> int:
        path, row = key.split("/")[0], int(key.split("/")[2])
        uses = [
            int(plan.read_first[i]) for i, (src, c) in enumerate(plan.reads) if src == path and c // per_shard == row
        ]
        return max(1, min(uses))  # a shard block 0 used too is wanted for its later blocks' reads

    blocks = [first_use(k) for k in wanted]
    assert blocks == sorted(blocks), list(zip(wanted, blocks))
    assert sorted(wanted) == sorted(f"{v}/c/{row}/0/0" for v in ("u", "w") for row in range(6))
