"""split_by_chunk: disjoint, covering, chunk-aligned, reproducible, JSON round trips."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import GzipCodec, ShardingCodec

from insitubatch.io.arrays import geometry_of
from insitubatch.io.geometry import ArrayGeometry
from insitubatch.plan.splits import SplitManifest, split_by_chunk


def _geom(n: int, size: int) -> ArrayGeometry:
    return ArrayGeometry(
        path="x", shape=(n, 3), chunks=(size, 3), stored_chunks=(size, 3), dtype=np.dtype("f4"), fill_value=0.0
    )


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 500),
    size=st.integers(1, 40),
    weights=st.lists(st.integers(0, 10), min_size=1, max_size=3).filter(lambda w: sum(w) > 0),
    contiguous=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_splits_are_disjoint_and_cover_the_range(n, size, weights, contiguous, seed, data) -> None:
    g = _geom(n, size)
    fractions = [w / sum(weights) for w in weights]
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    n_chunks = -(-stop // size) - start // size
    wanted = sum(1 for f in fractions if f > 0)
    if n_chunks < wanted:  # a split with a fraction gets a whole chunk: not enough of them is an error
        with pytest.raises(ValueError, match=f"but the range holds {n_chunks} chunk"):
            split_by_chunk(g, fractions=fractions, contiguous=contiguous, sample_range=(start, stop), seed=seed)
        return
    m = split_by_chunk(g, fractions=fractions, contiguous=contiguous, sample_range=(start, stop), seed=seed)
    for f, (_, chunks) in zip(fractions, m.splits):
        assert (len(chunks) > 0) == (f > 0)  # a fraction gets a chunk; a fraction of 0 gets none
        assert abs(len(chunks) - f * n_chunks) < len(fractions)  # and stays near its share
    all_chunks = [c for _, chunks in m.splits for c in chunks]
    assert len(all_chunks) == len(set(all_chunks)), "a chunk is in two splits"
    assert sorted(all_chunks) == list(range(start // size, -(-stop // size)))
    # every split's samples are whole chunks, clipped only at the array end
    for name in m.names:
        idx = m.sample_indices(name)
        assert len(idx) == sum(m.chunk_len(c) for c in m.chunks(name))
        assert np.all(idx < n)
    if contiguous:
        for _, chunks in m.splits:
            assert list(chunks) == list(range(chunks[0], chunks[0] + len(chunks))) if chunks else True
    assert SplitManifest.from_json(m.to_json()) == m


def test_fractions_are_of_chunks_with_exact_total() -> None:
    m = split_by_chunk(_geom(100, 10), fractions=(0.8, 0.1, 0.1))
    assert [len(m.chunks(s)) for s in ("train", "val", "test")] == [8, 1, 1]
    assert m.chunks("train") == tuple(range(8)) and m.chunks("val") == (8,) and m.chunks("test") == (9,)


def test_sample_range_snaps_outward_to_chunks() -> None:
    m = split_by_chunk(_geom(100, 10), fractions=(1.0,), sample_range=(15, 42))
    assert m.chunks("train") == (1, 2, 3, 4)
    assert m.sample_indices("train")[0] == 10 and m.sample_indices("train")[-1] == 49


def test_partial_final_chunk_is_kept_short() -> None:
    m = split_by_chunk(_geom(23, 10), fractions=(1.0,))
    assert m.chunks("train") == (0, 1, 2)
    assert len(m.sample_indices("train")) == 23


def test_shuffled_split_is_deterministic_by_seed() -> None:
    g = _geom(1000, 10)
    a = split_by_chunk(g, contiguous=False, seed=3)
    b = split_by_chunk(g, contiguous=False, seed=3)
    c = split_by_chunk(g, contiguous=False, seed=4)
    assert a == b
    assert a.chunks("val") != c.chunks("val")
    assert a.chunks("train") != tuple(range(80))


def test_empty_split_is_allowed() -> None:
    m = split_by_chunk(_geom(30, 10), fractions=(0.9, 0.1, 0.0))
    assert m.chunks("test") == ()
    assert len(m.sample_indices("test")) == 0
    assert m.asked_empty("test") and not m.asked_empty("val")


@pytest.mark.parametrize(
    "n_chunks, fractions, counts",
    [
        (6, (0.8, 0.1, 0.1), [4, 1, 1]),  # largest remainder alone gives 5/1/0
        (3, (0.8, 0.1, 0.1), [1, 1, 1]),
        (10, (0.98, 0.01, 0.01), [8, 1, 1]),
        (4, (0.5, 0.5, 0.0), [2, 2, 0]),
        (10, (0.8, 0.1, 0.1), [8, 1, 1]),  # unchanged where every split already had a chunk
    ],
)
def test_every_split_with_a_fraction_gets_a_chunk(n_chunks, fractions, counts) -> None:
    m = split_by_chunk(_geom(n_chunks * 10, 10), fractions=fractions)
    assert [len(m.chunks(s)) for s in m.names] == counts


def test_fewer_chunks_than_splits_with_a_fraction_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="3 splits have a non-zero fraction .* but the range holds 2 chunk"):
        split_by_chunk(_geom(20, 10), fractions=(0.8, 0.1, 0.1))


def test_named_fractions_mapping() -> None:
    m = split_by_chunk(_geom(40, 10), fractions={"fit": 0.5, "score": 0.5})
    assert m.names == ("fit", "score")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fractions": (0.5, 0.6)}, "sum to"),
        ({"fractions": (1.2, -0.2)}, "must be in \\[0, 1\\]"),
        ({"fractions": (0.25,) * 4}, "1 to 3 entries"),
        ({"sample_range": (-1, 5)}, "0 <= start < stop <= 100"),
        ({"sample_range": (5, 101)}, "0 <= start < stop <= 100"),
        ({"sample_range": (5, 5)}, "0 <= start < stop"),
        ({"seed": -1}, "seed=-1 must be >= 0"),
    ],
)
def test_invalid_arguments_raise_naming_them(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        split_by_chunk(_geom(100, 10), **kwargs)


def test_unknown_split_name_raises() -> None:
    m = split_by_chunk(_geom(100, 10))
    with pytest.raises(KeyError, match="splits are \\['train', 'val', 'test'\\]"):
        m.chunks("holdout")


def test_malformed_json_raises() -> None:
    with pytest.raises(ValueError, match="not a SplitManifest"):
        SplitManifest.from_json('{"format": 1}')


def test_a_sharded_array_splits_by_inner_chunk(tmp_path) -> None:
    arr = zarr.create_array(tmp_path / "a.zarr", shape=(40, 4), chunks=(2, 4), shards=(8, 4), dtype="f4")
    m = split_by_chunk(geometry_of(arr), fractions=(1.0,))  # inner chunks are read alone: they are the grid
    assert m.sample_chunk_size == 2 and m.chunks("train") == tuple(range(20))
    # a shard compressed again as a whole can only be read whole: the shard is the grid
    with pytest.warns(UserWarning, match="disables partial reads"):
        whole = zarr.create_array(
            tmp_path / "b.zarr",
            shape=(40, 4),
            chunks=(8, 4),
            dtype="f4",
            serializer=ShardingCodec(chunk_shape=(2, 4)),
            compressors=[GzipCodec()],
        )
    assert split_by_chunk(geometry_of(whole), fractions=(1.0,)).sample_chunk_size == 8
