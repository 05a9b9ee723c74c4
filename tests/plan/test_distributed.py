"""Rank sharding: chunk-disjoint, equal batch counts, exact eval, elastic resume, real gloo groups."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, run_gloo_ranks

from insitubatch import InSituDataset, open_geometries, split_by_chunk, split_by_time
from insitubatch.plan.distributed import resolve_world

N = 203  # not a multiple of anything, so the tail is ragged
# Ways to split the same array: by chunk fractions, by dates at chunk granularity, by exact dates.
# Steps are 5 hours apart and chunks 4 steps long, so day boundaries cut chunks.
SPLITTERS = {
    "fractions": lambda g: split_by_chunk(g, fractions=(0.8, 0.2)),
    "dates": lambda g: split_by_time(g, {"train": (None, "2000-01-30"), "val": ("2000-01-31", None)}),
    "exact-dates": lambda g: split_by_time(
        g, {"train": (None, "2000-01-30"), "val": ("2000-01-31", None)}, edges="exact"
    ),
}


@pytest.fixture
def path(tmp_path) -> Path:
    root = zarr.open_group(tmp_path / "d.zarr", mode="w")
    x = np.random.default_rng(0).random((N, 3, 2), dtype="f4")
    root.create_array("x", shape=x.shape, chunks=(4, 3, 2), dtype="f4", dimension_names=("time", "a", "b"))[:] = x
    cf = {"units": "hours since 2000-01-01", "calendar": "proleptic_gregorian"}
    root.create_array("time", shape=(N,), dtype="i8", dimension_names=("time",), attributes=cf)[:] = np.arange(N) * 5
    return tmp_path / "d.zarr"


def _ds(store, rank, world, splitter="fractions", **kw):
    g = open_geometries(store)["x"]
    m = SPLITTERS[splitter](g)
    kw = {"batch_size": 6, "block_chunks": 3, "seed": 5, **kw}
    return InSituDataset(store, m, {"x": g}, rank=rank, world_size=world, **kw)


@pytest.mark.parametrize("splitter", list(SPLITTERS))
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("last_batch", ["pad", "drop", "partial"])
def test_ranks_split_the_epoch_by_chunks_with_equal_batch_counts(path, world, last_batch, splitter) -> None:
    per_rank, chunks, lens = [], [], []
    for rank in range(world):
        store = CountingStore(local_store(path))
        with _ds(store, rank, world, splitter, last_batch=last_batch) as ds:
            store.reset()
            batches = list(ds.train)
            lens.append(len(ds.train))
            assert len(batches) == len(ds.train)
            real = [b.sample_indices[~b.extras.get("padded", np.zeros(len(b), bool))] for b in batches]
            per_rank.append(np.concatenate(real))
            full = batches if last_batch != "partial" else batches[:-1]  # partial: each rank's last may be short
            assert all(len(b) == ds.batch_size for b in full) and all(len(b) <= ds.batch_size for b in batches)
            chunks.append(set(store.chunk_gets()))
            split = ds.manifest.sample_indices("train")
    assert len(set(lens)) == 1, f"unequal batch counts {lens} would hang DDP"
    union = np.concatenate(per_rank)
    assert len(union) == len(set(union.tolist())), "a sample was drawn by two ranks"
    if last_batch != "drop":
        assert sorted(union.tolist()) == split.tolist()
    else:
        assert set(union.tolist()) <= set(split.tolist()) and len(split) - len(union) < world * 6 * 2
    for a in range(world):
        for b in range(a + 1, world):  # partial moves the ends of long ranks to short ones: their chunks are shared
            assert last_batch == "partial" or not chunks[a] & chunks[b], "two ranks fetched the same chunk"


@pytest.mark.parametrize("splitter", list(SPLITTERS))
@pytest.mark.parametrize("world", [2, 3])
def test_eval_passes_are_exactly_complete(path, world, splitter) -> None:
    val, infer = [], []
    for rank in range(world):
        with _ds(str(path), rank, world, splitter) as ds:
            val.extend(i for b in ds.val for i in b.sample_indices.tolist())
            infer.extend(i for b in ds.infer((10, 170)) for i in b.sample_indices.tolist())
    with _ds(str(path), 0, 1, splitter) as ds:
        assert val == ds.manifest.sample_indices("val").tolist()
    assert infer == list(range(10, 170))


@pytest.mark.parametrize("old, new", [(4, 2), (2, 3), (3, 1)])
def test_resume_at_another_world_size_has_no_duplicates_and_no_gaps(path, old, new) -> None:
    k = 3
    seen: list[int] = []
    state = None
    for rank in range(old):
        with _ds(str(path), rank, old, last_batch="pad") as ds:
            ds.set_epoch(1)
            it = iter(ds.train)
            for _ in range(k):
                b = next(it)
                seen.extend(b.sample_indices[~b.extras.get("padded", np.zeros(len(b), bool))].tolist())
            state = json.loads(json.dumps(ds.train.state_dict()))
            it.close()
    assert state["world_size"] == old and state["batches_consumed"] == k
    lens = []
    for rank in range(new):
        with _ds(str(path), rank, new, last_batch="pad") as ds:
            ds.train.load_state_dict(state)
            n = 0
            for b in ds.train:
                seen.extend(b.sample_indices[~b.extras.get("padded", np.zeros(len(b), bool))].tolist())
                n += 1
            lens.append(n)
            assert ds.epoch == 1
    assert len(set(lens)) == 1
    with _ds(str(path), 0, 1) as ds:
        split = ds.manifest.sample_indices("train").tolist()
    assert sorted(seen) == split, "resume at another world size lost or repeated samples"


def test_global_order_does_not_depend_on_world_size(path) -> None:
    with _ds(str(path), 0, 1) as one:
        single = np.concatenate([b.sample_indices for b in one.train]).tolist()
    dealt = []
    for rank in range(2):
        with _ds(str(path), rank, 2) as ds:
            dealt.append(ds.plan("train").anchors.tolist())
    # each rank's stream is an order-preserving subsequence of the single-process order
    pos = {a: i for i, a in enumerate(single)}
    for stream in dealt:
        real = [a for a in stream if a in pos]
        idx = [pos[a] for a in dict.fromkeys(real)]
        assert idx == sorted(idx)


def test_world_resolution(monkeypatch) -> None:
    assert resolve_world(None, None) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert resolve_world(None, None) == (2, 4)
    assert resolve_world(1, 3) == (1, 3)  # explicit wins
    with pytest.raises(ValueError, match="rank=3 must be in \\[0, world_size=3\\)"):
        resolve_world(3, 3)
    with pytest.raises(ValueError, match="world_size=0 must be >= 1"):
        resolve_world(0, 0)
    with pytest.raises(ValueError, match="rank=-1"):
        resolve_world(-1, 2)


WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[3])
    sys.path.insert(0, os.path.dirname(sys.argv[3]))  # this tree's insitubatch, not an installed one
    from helpers import CountingStore, local_store
    from insitubatch import InSituDataset, open_geometries, split_by_chunk

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    store = CountingStore(local_store(sys.argv[1]))
    g = open_geometries(store)["x"]
    ds = InSituDataset(store, split_by_chunk(g, fractions=(0.8, 0.2)), {"x": g}, batch_size=6, block_chunks=3)
    assert (ds.rank, ds.world_size) == (rank, world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    store.reset()
    seen, steps = [], 0
    for batch in ds.train:
        x = torch.from_dlpack(batch.arrays["x"]).reshape(len(batch), -1)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()  # an all-reduce per step: unequal counts would hang
        pad = batch.extras.get("padded", np.zeros(len(batch), bool))
        seen.extend(batch.sample_indices[~pad].tolist()); steps += 1
    total = torch.tensor([steps]); dist.all_reduce(total)
    out = {"rank": rank, "steps": steps, "total": int(total), "seen": seen, "chunks": sorted(store.chunk_gets())}
    with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    ds.close(); dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_under_a_real_gloo_group(path, tmp_path, world) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    args = [sys.executable, str(script), str(path), str(tmp_path), str(Path(__file__).parents[1])]
    assert run_gloo_ranks(args, world, 120.0) == [0] * world
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert len({o["steps"] for o in outs}) == 1
    assert outs[0]["total"] == world * outs[0]["steps"]
    seen = sorted(i for o in outs for i in o["seen"])
    g = open_geometries(str(path))["x"]
    assert seen == split_by_chunk(g, fractions=(0.8, 0.2)).sample_indices("train").tolist()
    for a in range(world):
        for b in range(a + 1, world):
            assert not set(outs[a]["chunks"]) & set(outs[b]["chunks"])
