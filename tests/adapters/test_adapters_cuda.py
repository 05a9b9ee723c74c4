"""The CUDA path of ``as_torch``: pinned batch buffers, side-stream copies, device transforms.

Runs where torch sees a GPU: CI machines have none, so these skip there;
``python -m bench.gpu_check`` runs them on a GPU machine, beside its own checks.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, as_torch, open_geometries, split_by_chunk
from insitubatch.adapters.pinned import _buffer_of

torch = pytest.importorskip("torch")  # CI leg 2 (Python 3.13) installs no torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def ds(tmp_path):
    root = zarr.open_group(tmp_path / "g.zarr", mode="w")
    x = np.random.default_rng(0).random((96, 16, 32), dtype="f4")
    root.create_array("x", shape=x.shape, chunks=(8, 16, 16), dtype="f4")[:] = x
    g = open_geometries(str(tmp_path / "g.zarr"))["x"]
    with InSituDataset(
        str(tmp_path / "g.zarr"),
        split_by_chunk(g, fractions=(1.0,)),
        {"x": g, "y": g.shift(1)},
        batch_size=12,
        block_chunks=2,
    ) as d:
        yield d, x


def test_batches_land_on_the_device_equal_to_zarr(ds) -> None:
    d, x = ds
    tv = as_torch(d.train, device="cuda", device_transform=lambda b: {**b, "d": b["y"] - b["x"]})
    kept, order = [], [b.sample_indices for b in d.train]
    for tensors, idx in zip(tv, order):
        assert tensors["x"].is_cuda and tensors["d"].is_cuda
        kept.append((idx, tensors["x"]))
    torch.cuda.synchronize()
    for idx, t in kept:  # kept device tensors are never overwritten by later copies
        np.testing.assert_array_equal(t.cpu().numpy(), x[idx])


def test_batch_buffers_come_from_pinned_memory(ds) -> None:
    d, _ = ds
    as_torch(d.train, device="cuda")
    it = iter(d.train)
    batch = next(it)
    assert _buffer_of(batch.arrays["x"]) is not None
    assert torch.from_dlpack(batch.arrays["x"]).is_pinned()
    it.close()
