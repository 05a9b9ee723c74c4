"""``sorted_unique``: numpy's ``unique`` of integer ids, without the ``numpy.ma`` import a pass's start would pay."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.plan.epoch import sorted_unique


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_it_equals_numpys_unique(n) -> None:
    values = np.random.default_rng(n).integers(-5, 40, size=n)
    got = sorted_unique(values)
    np.testing.assert_array_equal(got, np.unique(values))
    assert got.dtype == values.dtype


def test_planning_a_pass_calls_no_numpy_unique(tmp_path, monkeypatch) -> None:
    """(zarr 3.4 imports ``numpy.ma`` itself; zarr 3.1 does not, and there the plan would pay for it.)"""
    arr = zarr.open_group(tmp_path / "a.zarr", mode="w").create_array("v", shape=(64, 4), chunks=(2, 4), dtype="f4")
    arr[...] = 1.0
    g = open_geometries(arr.store, variables=["v"])["v"]
    with InSituDataset(
        arr.store, split_by_chunk(g, fractions=(0.5, 0.5)), {"v": g}, batch_size=4, block_chunks=4
    ) as ds:

        def unique(*args, **kwargs):
            raise AssertionError("planning called np.unique")

        monkeypatch.setattr(np, "unique", unique)
        plan = ds.plan("train")
    assert plan.n_batches == 8
