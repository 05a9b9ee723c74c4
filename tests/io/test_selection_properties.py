"""Property: any selection, on any array shape, chunking and sample axis, equals numpy indexing of zarr's read."""

from __future__ import annotations

import numpy as np
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from insitubatch import InSituDataset, open_geometries, split_by_chunk


@st.composite
def cases(draw):
    ndim = draw(st.integers(2, 4))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, s)) for s in shape)
    sample_axis = draw(st.integers(0, ndim - 1))
    steps = []
    for axis in range(ndim):
        if axis == sample_axis or not draw(st.booleans()):
            continue
        n = shape[axis]
        kind = draw(st.sampled_from(["int", "slice", "list"]))
        if kind == "int":
            key = draw(st.integers(-n, n - 1))
        elif kind == "slice":
            step = draw(st.sampled_from([1, 2, -1, -2, 3]))
            start = draw(st.one_of(st.none(), st.integers(-n, n - 1)))
            stop = draw(st.one_of(st.none(), st.integers(-n, n)))
            key = slice(start, stop, step)
            if len(range(n)[key]) == 0:
                key = slice(None, None, step)
        else:
            key = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n + 2))
        steps.append((axis, key))
    return shape, chunks, sample_axis, steps, draw(st.integers(1, 5)), draw(st.integers(0, 2**16))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_selection_equals_numpy(case) -> None:
    shape, chunks, sample_axis, steps, batch_size, seed = case
    store = zarr.storage.MemoryStore()
    data = np.random.default_rng(seed).standard_normal(shape).astype("f4")
    root = zarr.open_group(store=store, mode="w")
    root.create_array("v", shape=shape, chunks=chunks, dtype="f4")[...] = data
    g = open_geometries(store, sample_axis=sample_axis)["v"]
    expected = np.moveaxis(data, sample_axis, 0)
    # numpy sees the axes sample-first: physical axis k lands at k + 1 before the sample axis, k after it
    for axis, key in steps:
        g = g.isel({axis: key})
    view = expected
    dropped_before = 0
    for axis, key in sorted(steps):
        where = (axis + 1 if axis < sample_axis else axis) - dropped_before
        index = [slice(None)] * view.ndim
        index[where] = key
        view = view[tuple(index)]
        dropped_before += isinstance(key, int)
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, {"v": g}, batch_size=batch_size, shuffle=True, seed=seed) as ds:
        seen = 0
        for batch in ds.train:
            np.testing.assert_array_equal(batch.arrays["v"], view[batch.sample_indices])
            seen += len(batch)
        assert seen == shape[sample_axis]
