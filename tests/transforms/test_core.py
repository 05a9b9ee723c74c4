"""The chunk-transform contract in the engine: scoping, reshaping, checks."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, applies, open_geometries, split_by_chunk


class HalveToF8:
    """2x2 block mean on the inner axes, cast to float64 (a declared reshape)."""

    def output_inner(self, g):
        return (g.inner_shape[0] // 2, g.inner_shape[1] // 2), np.dtype("f8")

    def __call__(self, chunk):
        d = chunk.data
        chunk.data = d.reshape(d.shape[0], d.shape[1] // 2, 2, d.shape[2] // 2, 2).mean(axis=(2, 4)).astype("f8")
        return chunk


def plus_one_in_place(chunk):
    chunk.data += 1  # decoded tiles can be read-only views; the engine must hand over a writable copy
    return chunk


@pytest.fixture
def pair(tmp_path):
    root = zarr.open_group(tmp_path / "p.zarr", mode="w")
    x = np.random.default_rng(0).random((40, 6, 8), dtype="f4")
    root.create_array("a", shape=x.shape, chunks=(5, 3, 4), dtype="f4")[:] = x  # 2x2 tiles per chunk
    root.create_array("b", shape=x.shape, chunks=(5, 6, 8), dtype="f4")[:] = 2 * x
    geoms = open_geometries(str(tmp_path / "p.zarr"))
    return str(tmp_path / "p.zarr"), x, split_by_chunk(geoms["a"], fractions=(1.0,))


def test_reshaping_transform_on_one_variable_leaves_the_other_untouched(pair) -> None:
    path, x, manifest = pair
    transforms = [applies(["a"], HalveToF8()), applies(["b"], plus_one_in_place)]
    with InSituDataset(path, manifest, batch_size=7, chunk_transforms=transforms) as ds:
        assert ds.geometries["a"].inner_shape == (3, 4) and ds.geometries["a"].dtype == np.float64
        assert ds.geometries["b"].inner_shape == (6, 8) and ds.geometries["b"].dtype == np.float32
        seen = 0
        for batch in ds.train:
            src = x[batch.sample_indices]
            np.testing.assert_allclose(batch.arrays["a"], src.reshape(-1, 3, 2, 4, 2).mean(axis=(2, 4)), rtol=1e-6)
            assert batch.arrays["a"].dtype == np.float64
            np.testing.assert_array_equal(batch.arrays["b"], 2 * src + 1)
            seen += len(batch)
        assert seen == 40


def test_undeclared_reshape_raises_naming_transform_and_shapes(pair) -> None:
    path, _, manifest = pair

    def crop(chunk):
        chunk.data = chunk.data[:, :2]
        return chunk

    with InSituDataset(path, manifest, ["b"], chunk_transforms=[crop]) as ds:
        with pytest.raises(ValueError, match=r"crop.*from \(5, 6, 8\) into \(5, 2, 8\).*declares no output_inner"):
            list(ds.train)


def test_a_transform_may_not_touch_the_sample_axis(pair) -> None:
    path, _, manifest = pair

    def drop_first(chunk):
        chunk.data = chunk.data[1:]
        return chunk

    with InSituDataset(path, manifest, ["a"], chunk_transforms=[drop_first]) as ds:
        with pytest.raises(ValueError, match="drop_first changed the sample axis of 'a' chunk"):
            list(ds.train)


@pytest.mark.parametrize("array", ["a", "b"])  # a multi-tile chunk (transformed once assembled) and a one-tile one
def test_a_transform_that_raises_is_raised_under_on_bad_chunk_nan_naming_array_and_chunk(pair, array) -> None:
    # a bug in a user's transform is not bad data: NaN-filling it would hide the bug
    path, x, manifest = pair

    def fails_on_chunk_3(chunk):
        if chunk.read.chunk_index == 3:
            raise ZeroDivisionError("the user's bug")
        return chunk

    with InSituDataset(
        path, manifest, [array], batch_size=5, shuffle=False, on_bad_chunk="nan", chunk_transforms=[fails_on_chunk_3]
    ) as ds:
        taken = 0
        scale = 1 if array == "a" else 2
        with pytest.raises(ZeroDivisionError, match="the user's bug") as info:
            for batch in ds.train:
                # what comes before the failing chunk is the data itself, no NaN
                np.testing.assert_array_equal(batch.arrays[array], scale * x[batch.sample_indices])
                taken += 1
        assert any(f"fails_on_chunk_3 on array {array!r} chunk 3" in note for note in info.value.__notes__)
        assert ds.bad_chunks == []
        assert taken <= 3  # chunks 0-2 at most (5 samples each, batches of 5, read in order)


def test_unscoped_transform_runs_on_every_array_once_per_chunk(pair) -> None:
    path, x, manifest = pair
    calls: list[tuple[str, int]] = []

    def record(chunk):
        calls.append((chunk.read.array, chunk.read.chunk_index))
        assert chunk.sample_offset == chunk.read.chunk_index * 5
        return chunk

    with InSituDataset(
        path,
        manifest,
        {"a": open_geometries(path)["a"], "a_next": open_geometries(path)["a"].shift(1)},
        chunk_transforms=[record],
    ) as ds:
        list(ds.train)
    assert sorted(calls) == [("a", c) for c in range(8)]  # aliased labels: one call per chunk
