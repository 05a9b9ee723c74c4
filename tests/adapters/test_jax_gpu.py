"""``to_jax`` onto a GPU: batches placed there equal to zarr, the spec on that device, a device transform.

Runs where JAX sees a GPU; machines without one skip it (the error a GPU
name gives there is tested in ``test_specs.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, open_geometries, split_by_chunk, to_jax

jax = pytest.importorskip("jax")


def _gpus() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU backend here
        return []


@pytest.fixture
def ds(tmp_path):
    # asked here, not at collection: starting JAX's backends makes any later os.fork() in the run warn
    if not _gpus():
        pytest.skip("needs a GPU JAX can see")
    root = zarr.open_group(tmp_path / "g.zarr", mode="w")
    x = np.random.default_rng(0).random((96, 16, 32), dtype="f4")
    root.create_array("x", shape=x.shape, chunks=(8, 16, 16), dtype="f4")[:] = x
    g = open_geometries(str(tmp_path / "g.zarr"))["x"]
    with InSituDataset(
        str(tmp_path / "g.zarr"), split_by_chunk(g, fractions=(1.0,)), {"x": g, "y": g.shift(1)}, batch_size=12
    ) as d:
        yield d, x


@pytest.mark.parametrize("device", ["gpu", "cuda", "gpu:0"])
def test_batches_land_on_the_gpu_equal_to_zarr(ds, device) -> None:
    d, x = ds
    gpu = _gpus()[0]
    jv = to_jax(d.train, device=device, device_transform=jax.jit(lambda b: {**b, "d": b["y"] - b["x"]}))
    assert jv.device == gpu and all(s.sharding.device_set == {gpu} for s in jv.spec.values())
    step = jax.jit(lambda b: (b["y"] - b["x"]).sum()).lower(jv.spec).compile()
    order = [b.sample_indices for b in d.train]
    for idx, arrays in zip(order, jv, strict=True):
        assert {dev for a in arrays.values() for dev in a.devices()} == {gpu}
        np.testing.assert_array_equal(np.asarray(arrays["x"]), x[idx])
        np.testing.assert_allclose(np.asarray(arrays["d"]), x[idx + 1] - x[idx], rtol=1e-6)
        if len(idx) == jv.spec["x"].shape[0]:
            np.testing.assert_allclose(float(step(arrays)), float((x[idx + 1] - x[idx]).sum()), rtol=1e-4)
