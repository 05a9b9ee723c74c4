"""``sorted_unique``: numpy's ``unique`` of integer ids, without the ``numpy.ma`` import a pass's start would pay."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from insitubatch.plan.epoch import sorted_unique


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_it_equals_numpys_unique(n) -> None:
    values = np.random.default_rng(n).integers(-5, 40, size=n)
    got = sorted_unique(values)
    np.testing.assert_array_equal(got, np.unique(values))
    assert got.dtype == values.dtype


def test_planning_a_pass_imports_no_masked_arrays(tmp_path) -> None:
    code = f"""
import sys
import numpy as np
import zarr
from insitubatch import InSituDataset, open_geometries, split_by_chunk
arr = zarr.open_group({str(tmp_path / "a.zarr")!r}, mode="w").create_array("v", shape=(64, 4), chunks=(2, 4), dtype="f4")
arr[...] = 1.0
g = open_geometries(arr.store, variables=["v"])["v"]
with InSituDataset(arr.store, split_by_chunk(g, fractions=(0.5, 0.5)), {{"v": g}}, batch_size=4, block_chunks=4) as ds:
    ds.plan("train")
print("numpy.ma" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
