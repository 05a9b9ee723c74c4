"""Stateful views: ``state_dict``/``load_state_dict`` on every view, at the consumer's position.

The data holds each sample's index (``x[i] == i``), so the tensors themselves
say which samples a run saw; zarr wrote it and the uninterrupted run is the oracle.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, as_torch, open_geometries, split_by_chunk, to_jax

torch = pytest.importorskip("torch")

N = 100  # samples: 13 chunks of 8 (the last holds 4), batches of 6 never fill the epoch evenly
BATCH = 6


@pytest.fixture
def path(tmp_path):
    root = zarr.open_group(tmp_path / "s.zarr", mode="w")
    x = np.repeat(np.arange(N, dtype="f4")[:, None], 3, axis=1)
    root.create_array("x", shape=x.shape, chunks=(8, 3), dtype="f4", dimension_names=("time", "c"))[:] = x
    return str(tmp_path / "s.zarr")


def _ds(path, rank=0, world=1, **kw) -> InSituDataset:
    g = open_geometries(path)["x"]
    kw = {"batch_size": BATCH, "block_chunks": 3, "seed": 11, **kw}
    return InSituDataset(path, split_by_chunk(g, fractions=(1.0,)), {"x": g}, rank=rank, world_size=world, **kw)


def _ids(tensors) -> list[int]:
    return tensors["x"][:, 0].to(torch.int64).tolist()


def _roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))  # what a checkpoint file holds


def test_torch_view_resumes_at_the_items_the_consumer_took(path) -> None:
    with _ds(path) as ds:
        ds.set_epoch(3)
        expected = [_ids(t) for t in as_torch(ds.train)]
    for k in (0, 1, 7, len(expected) - 1, len(expected)):
        with _ds(path, prefetch_depth=4) as first:
            tv = as_torch(first.train)
            first.set_epoch(3)
            loader = torch.utils.data.DataLoader(tv, batch_size=None, num_workers=0)
            it = iter(loader)
            taken = [_ids(next(it)) for _ in range(k)]
            # the producer runs ahead (prefetch_depth=4): the state counts what the consumer took
            first.train.last_pass  # noqa: B018  (live stats: the pass is running)
            state = _roundtrip(tv.state_dict())
            del it, loader
        assert taken == expected[:k]
        assert state["epoch"] == 3 and state["batches_consumed"] == k
        with _ds(path) as second:
            tv = as_torch(second.train)
            tv.load_state_dict(state)
            assert [_ids(t) for t in tv] == expected[k:]


def test_the_position_outlives_the_pass_that_made_it(path) -> None:
    """A pass nobody holds is collected: its end (an epoch done, a break) is still the view's position."""
    with _ds(path) as ds:
        tv = as_torch(ds.train)
        n = len(tv)
        for _ in tv:
            pass
        gc.collect()
        assert tv.state_dict()["batches_consumed"] == n
        for i, _ in enumerate(tv):
            if i == 4:
                break
        gc.collect()
        assert tv.state_dict()["batches_consumed"] == 5
        ds.set_epoch(1)  # a new epoch starts at its beginning
        assert tv.state_dict()["batches_consumed"] == 0 and tv.state_dict()["epoch"] == 1


def test_jax_view_state_round_trips(path) -> None:
    pytest.importorskip("jax")
    with _ds(path) as ds:
        expected = [np.asarray(a["x"])[:, 0].astype(int).tolist() for a in to_jax(ds.train)]
    with _ds(path) as first:
        jv = to_jax(first.train)
        it = iter(jv)
        for _ in range(5):
            next(it)
        state = _roundtrip(jv.state_dict())
        del it
    assert state["batches_consumed"] == 5
    with _ds(path) as second:
        jv = to_jax(second.train)
        jv.load_state_dict(state)
        assert [np.asarray(a["x"])[:, 0].astype(int).tolist() for a in jv] == expected[5:]


@pytest.mark.invariant
@pytest.mark.parametrize("old, new", [(2, 2), (2, 3), (3, 1)])
@pytest.mark.parametrize("last_batch", ["pad", "partial", "drop"])
def test_torch_views_resume_at_the_same_and_another_world_size(path, old, new, last_batch) -> None:
    """Every rank takes k items; rank 0's state (all ranks' in lockstep) resumes the job on ``new`` ranks."""
    k = 3
    seen: list[int] = []
    state = None
    for rank in range(old):
        with _ds(path, rank, old, last_batch=last_batch) as ds:
            tv = as_torch(ds.train, mask_key="padded")
            if old == new:
                expected = [_real(t) for t in tv]
            it = iter(tv)
            for _ in range(k):
                seen.extend(_real(next(it)))
            if rank == 0:
                state = _roundtrip(tv.state_dict())
            del it
        if old == new:  # at the same world size each rank yields exactly the batches it had not
            with _ds(path, rank, new, last_batch=last_batch) as ds:
                tv = as_torch(ds.train, mask_key="padded")
                tv.load_state_dict(state)
                assert [_real(t) for t in tv] == expected[k:]
    assert state is not None and state["world_size"] == old and state["batches_consumed"] == k
    counts = []
    for rank in range(new):
        with _ds(path, rank, new, last_batch=last_batch) as ds:
            tv = as_torch(ds.train, mask_key="padded")
            tv.load_state_dict(state)
            items = list(tv)
            counts.append(len(items))
            assert all(len(t["x"]) == BATCH for t in items[:-1])
            seen.extend(i for t in items for i in _real(t))
    assert len(set(counts)) == 1, f"ranks resumed with unequal batch counts {counts}"
    assert len(seen) == len(set(seen)), "a sample was seen twice across the resume"
    if last_batch == "drop":  # what the ranks could not share in full batches, at most a batch per rank a deal
        assert set(seen) <= set(range(N)) and N - len(seen) < 2 * new * BATCH + 2 * old * BATCH
    else:
        assert sorted(seen) == list(range(N)), "a sample was lost across the resume"


def _real(tensors) -> list[int]:
    """The samples of an item that are not padding."""
    return tensors["x"][~tensors["padded"], 0].to(torch.int64).tolist()


def test_the_padding_mask_is_in_every_item_and_names_no_label(path) -> None:
    with _ds(path, 0, 1, last_batch="pad") as ds:
        tv = as_torch(ds.train, mask_key="padded")
        items = list(tv)
        assert tv.spec["padded"] == (torch.Size((BATCH,)), torch.bool)
        assert all(t["padded"].shape == (BATCH,) and t["x"].shape[0] == BATCH for t in items)
        ids = [i for t in items for i in _real(t)]
        assert sorted(ids) == list(range(N)) and int(items[-1]["padded"].sum()) == len(items) * BATCH - N
        with pytest.raises(ValueError, match=r"mask_key='x' must not name a label; the labels are \['x'\]"):
            as_torch(ds.train, mask_key="x")
        with pytest.raises(TypeError, match="mask_key must be a str"):
            as_torch(ds.train, mask_key=3)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CUDA path stages a batch ahead)")
def test_a_batch_staged_on_the_gpu_is_not_counted_as_taken(path) -> None:
    with _ds(path) as ds:
        expected = [_ids(t) for t in as_torch(ds.train)]
    with _ds(path) as first:
        tv = as_torch(first.train, device="cuda")
        it = iter(tv)
        taken = [_ids(next(it)) for _ in range(4)]  # the fifth batch is on its way to the device
        state = _roundtrip(tv.state_dict())
        del it
    assert taken == expected[:4] and state["batches_consumed"] == 4
    with _ds(path) as second:
        tv = as_torch(second.train, device="cuda")
        tv.load_state_dict(state)
        assert [_ids(t) for t in tv] == expected[4:]
