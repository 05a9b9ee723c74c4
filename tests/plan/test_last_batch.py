"""``last_batch``: pad, drop or partial, on one rank and on several, ranks at equal batch counts."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.plan.distributed import rank_streams
from insitubatch.plan.epoch import EpochOrder

N, CHUNK, BATCH = 70, 7, 4  # 10 chunks of 7 samples: 70 = 17 batches of 4 and 2 left over


def _order(chunk_sizes: list[int], block_chunks: int = 2) -> EpochOrder:
    """An epoch of chunks ``0..`` holding ``chunk_sizes`` samples, in blocks of ``block_chunks`` chunks."""
    order = np.array([[c, w] for c, n in enumerate(chunk_sizes) for w in range(n)], dtype=np.int64).reshape(-1, 2)
    ends = np.cumsum(chunk_sizes)[block_chunks - 1 :: block_chunks].tolist()
    starts = sorted({0, *ends, len(order)})
    return EpochOrder(order, np.asarray(starts, dtype=np.int64))


def _real(stream) -> list[int]:
    return stream.rows[~stream.padded].tolist()


@pytest.mark.invariant
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("sizes", [[7] * 10, [5, 9, 1, 7, 3, 8], [3, 3], [1]])
def test_each_policy_keeps_ranks_at_equal_batch_counts(world, sizes) -> None:
    eo = _order(sizes)
    total = sum(sizes)
    for policy in ("pad", "drop", "partial"):
        streams = rank_streams(eo, world, batch_size=BATCH, last_batch=policy)
        n = {-(-len(s.rows) // BATCH) for s in streams}
        assert len(n) == 1, f"{policy}: ranks have batch counts {[len(s.rows) for s in streams]}"
        real = [i for s in streams for i in _real(s)]
        assert len(real) == len(set(real)), f"{policy}: a sample dealt twice"
        if policy == "pad":
            assert sorted(real) == list(range(total))
            assert all(len(s.rows) % BATCH == 0 for s in streams)  # every batch full
            for s in streams:  # a repeat is one of the rank's own samples where it has any
                assert set(s.rows[s.padded].tolist()) <= set(_real(s)) or not _real(s)
        elif policy == "drop":
            assert all(len(s.rows) % BATCH == 0 and not s.padded.any() for s in streams)
            assert total - len(real) < world * (max(sizes) + BATCH)
        else:
            assert sorted(real) == list(range(total))
            (batches,) = n
            assert all((batches - 1) * BATCH < len(s.rows) <= batches * BATCH for s in streams)
            enough = total >= world * ((batches - 1) * BATCH + 1)
            assert enough == (not any(s.padded.any() for s in streams))


def test_partial_moves_only_what_unequal_batch_counts_need() -> None:
    """Chunks of 7 cut 3 ranks at 21/28/21 samples: 6, 7, 6 batches of 4; partial moves the fewest samples."""
    eo = _order([7] * 10, block_chunks=1)
    pad = rank_streams(eo, 3, batch_size=BATCH, last_batch="pad")
    cut = [len(_real(s)) for s in pad]
    partial = rank_streams(eo, 3, batch_size=BATCH, last_batch="partial")
    sizes = [len(s.rows) for s in partial]
    assert sum(sizes) == N and not any(s.padded.any() for s in partial)
    # each rank keeps the start of its chunk-aligned stream
    for p, s in zip(pad, partial, strict=True):
        kept = min(len(_real(p)), len(s.rows))
        assert s.rows[:kept].tolist() == _real(p)[:kept]
    moved = sum(max(c - s, 0) for c, s in zip(cut, sizes, strict=True))
    assert moved <= max(CHUNK, BATCH), f"moved {moved} samples for counts {cut} -> {sizes}"


def test_a_single_rank_policy_changes_only_the_end() -> None:
    eo = _order([7] * 10)
    (partial,) = rank_streams(eo, 1, batch_size=BATCH, last_batch="partial")
    (pad,) = rank_streams(eo, 1, batch_size=BATCH, last_batch="pad")
    (drop,) = rank_streams(eo, 1, batch_size=BATCH, last_batch="drop")
    assert partial.rows.tolist() == list(range(N))
    assert pad.rows[:N].tolist() == list(range(N)) and pad.padded.sum() == 2 and len(pad.rows) == 72
    assert pad.rows[N:].tolist() == [0, 1]  # the rank's own first samples, marked
    assert drop.rows.tolist() == list(range(68))
    (default,) = rank_streams(eo, 1, batch_size=BATCH)
    assert default.rows.tolist() == partial.rows.tolist()


def test_an_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"last_batch='fill' must be one of \('pad', 'drop', 'partial'\)"):
        rank_streams(_order([4]), 2, batch_size=BATCH, last_batch="fill")  # type: ignore[arg-type]


# -- a real dataset ---------------------------------------------------------------------------


@pytest.fixture
def path(tmp_path):
    root = zarr.open_group(tmp_path / "l.zarr", mode="w")
    x = np.repeat(np.arange(N, dtype="f4")[:, None], 2, axis=1)
    root.create_array("x", shape=x.shape, chunks=(CHUNK, 2), dtype="f4", dimension_names=("time", "c"))[:] = x
    return str(tmp_path / "l.zarr")


def _ds(path, rank=0, world=1, **kw) -> InSituDataset:
    g = open_geometries(path)["x"]
    return InSituDataset(
        path, split_by_chunk(g, fractions=(1.0,)), {"x": g}, batch_size=BATCH, block_chunks=2, rank=rank,
        world_size=world, seed=3, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("policy", ["pad", "drop", "partial", None])
def test_a_dataset_yields_what_its_policy_says(path, world, policy) -> None:
    x = zarr.open_array(path + "/x", mode="r")[...]
    real, counts, sizes = [], [], []
    for rank in range(world):
        with _ds(path, rank, world, last_batch=policy) as ds:
            assert ds.last_batch == (policy or ("pad" if world > 1 else "partial"))
            assert ds.describe()["resolved"]["last_batch"] == ds.last_batch
            batches = list(ds.train)
            assert len(batches) == len(ds.train)
            counts.append(len(batches))
            sizes.extend(len(b) for b in batches)
            for b in batches:
                np.testing.assert_array_equal(b.arrays["x"], x[b.sample_indices])  # zarr is the oracle
                assert b.padded.shape == (len(b),) and b.padded.dtype == bool
                real.extend(b.sample_indices[~b.padded].tolist())
            if ds.last_batch == "partial":
                assert all(len(b) == BATCH for b in batches[:-1]) and not any(b.padded.any() for b in batches)
    assert len(set(counts)) == 1, f"unequal batch counts {counts}"
    assert len(real) == len(set(real))
    resolved = policy or ("pad" if world > 1 else "partial")
    if resolved == "drop":
        assert set(sizes) == {BATCH} and N - len(real) < world * (CHUNK + BATCH)
    else:
        assert sorted(real) == list(range(N))
    if resolved == "pad":
        assert set(sizes) == {BATCH}


def test_remainder_is_a_deprecated_alias(path) -> None:
    with pytest.warns(DeprecationWarning, match="remainder='drop' is deprecated: use last_batch='drop'"):
        with _ds(path, remainder="drop") as ds:
            assert ds.last_batch == "drop" and all(len(b) == BATCH for b in ds.train)
    with pytest.warns(DeprecationWarning):
        with _ds(path, 0, 2, remainder="pad") as ds:
            assert ds.last_batch == "pad"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="remainder='drop' contradicts"):
        _ds(path, remainder="drop", last_batch="partial")
    with pytest.raises(ValueError, match=r"last_batch='short' must be one of \('pad', 'drop', 'partial'\)"):
        _ds(path, last_batch="short")
