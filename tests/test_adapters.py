"""torch and JAX adapters: zero-copy DLPack, lifetime safety, DataLoader wrapping."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, as_torch, open_geometries, split_by_chunk, to_jax

torch = pytest.importorskip("torch")  # the Python 3.12 CI leg installs no torch


@pytest.fixture
def ds(tmp_path):
    root = zarr.open_group(tmp_path / "a.zarr", mode="w")
    x = np.random.default_rng(0).random((48, 4, 5), dtype="f4")
    root.create_array("x", shape=x.shape, chunks=(6, 4, 5), dtype="f4")[:] = x
    g = open_geometries(str(tmp_path / "a.zarr"))["x"]
    with InSituDataset(str(tmp_path / "a.zarr"), split_by_chunk(g, fractions=(1.0,)), {"x": g, "y": g.shift(2)},
                       batch_size=5, block_chunks=2) as d:
        yield d, x


def test_cpu_tensors_share_memory_with_the_batch_buffer(ds) -> None:
    d, x = ds
    it = iter(d.train)
    batch = next(it)
    t = torch.from_dlpack(batch.arrays["x"])
    assert t.data_ptr() == batch.arrays["x"].ctypes.data
    it.close()
    for tensors in as_torch(d.train):
        assert set(tensors) == {"x", "y"} and tensors["x"].dtype == torch.float32
        assert tensors["x"].shape[1:] == (4, 5)
        break


def test_kept_tensors_are_never_overwritten(ds) -> None:
    d, x = ds
    kept = []
    for batch in d.train:
        kept.append((batch.sample_indices.copy(), torch.from_dlpack(batch.arrays["x"]), batch.arrays["x"].ctypes.data))
        del batch
    for idx, t, _ in kept:
        np.testing.assert_array_equal(t.numpy(), x[idx])
    assert len({ptr for *_, ptr in kept}) == len(kept)  # each kept export holds its own buffer


def test_tensors_match_zarr_through_a_dataloader(ds) -> None:
    d, x = ds
    tv = as_torch(d.train, device_transform=lambda b: {**b, "diff": b["y"] - b["x"]})
    loader = torch.utils.data.DataLoader(tv, batch_size=None, num_workers=0)
    assert len(loader) == len(d.train)
    n = 0
    for tensors in loader:
        n += tensors["x"].shape[0]
        assert torch.allclose(tensors["diff"], tensors["y"] - tensors["x"])
    assert n == 46  # 48 anchors minus the 2 whose y window runs off the array


@pytest.mark.filterwarnings("ignore:Got pickle error")
@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_dataloader_workers_raise_a_clear_error(ds, context) -> None:
    d, _ = ds
    tv = as_torch(d.train)
    loader = torch.utils.data.DataLoader(tv, batch_size=None, num_workers=1, multiprocessing_context=context)
    with pytest.raises((TypeError, RuntimeError), match="num_workers > 0"):
        next(iter(loader))


def test_cuda_device_without_cuda_is_a_clear_error(ds) -> None:
    d, _ = ds
    if torch.cuda.is_available():  # a GPU machine exercises the real path in test_adapters_cuda.py
        return
    with pytest.raises(ValueError, match="needs CUDA"):
        as_torch(d.train, device="cuda")


def test_jax_arrays_match(ds) -> None:
    jax = pytest.importorskip("jax")
    d, x = ds
    seen = 0
    for arrays in to_jax(d.train, device=jax.devices()[0]):
        assert isinstance(arrays["x"], jax.Array) and arrays["y"].shape[1:] == (4, 5)
        seen += arrays["x"].shape[0]
    assert seen == 46
    # the same order as the numpy batches of the same epoch
    numpy_batches = [b.sample_indices for b in d.train]
    for idx, arrays in zip(numpy_batches, to_jax(d.train)):
        np.testing.assert_array_equal(np.asarray(arrays["x"]), x[idx])
        np.testing.assert_array_equal(np.asarray(arrays["y"]), x[idx + 2])
