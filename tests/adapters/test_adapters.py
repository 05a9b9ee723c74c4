"""torch and JAX adapters: zero-copy DLPack, lifetime safety, DataLoader wrapping."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from insitubatch import Batch, InSituDataset, as_torch, open_geometries, split_by_chunk, to_jax, to_torch

torch = pytest.importorskip("torch")  # CI leg 2 (Python 3.13) installs no torch


@pytest.fixture
def ds(tmp_path):
    root = zarr.open_group(tmp_path / "a.zarr", mode="w")
    x = np.random.default_rng(0).random((48, 4, 5), dtype="f4")
    root.create_array("x", shape=x.shape, chunks=(6, 4, 5), dtype="f4")[:] = x
    g = open_geometries(str(tmp_path / "a.zarr"))["x"]
    with InSituDataset(
        str(tmp_path / "a.zarr"),
        split_by_chunk(g, fractions=(1.0,)),
        {"x": g, "y": g.shift(2)},
        batch_size=5,
        block_chunks=2,
    ) as d:
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
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")  # JAX's, once a test started it
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


def test_inference_items_carry_coords_beside_the_tensors(ds) -> None:
    d, x = ds
    view = d.infer((0, 20), batch_size=6)
    seen = []
    for tensors, coords in as_torch(view):
        assert set(tensors) == {"x", "y"}
        idx = coords["sample"]  # no coordinate array in this store: the indices
        np.testing.assert_array_equal(tensors["x"].numpy(), x[idx])
        np.testing.assert_array_equal(tensors["y"].numpy(), x[idx + 2])
        seen.extend(idx.tolist())
    assert seen == list(range(20))
    doubled = as_torch(view, device_transform=lambda t: {k: 2 * v for k, v in t.items()})
    for tensors, coords in doubled:
        np.testing.assert_array_equal(tensors["x"].numpy(), 2 * x[coords["sample"]])
    jax = pytest.importorskip("jax")
    for (arrays, coords), batch in zip(to_jax(view), view):
        assert isinstance(arrays["x"], jax.Array)
        np.testing.assert_array_equal(coords["sample"], batch.coords["sample"])
        np.testing.assert_array_equal(np.asarray(arrays["x"]), x[batch.sample_indices])
    # training items stay {label: tensor}
    assert set(next(iter(as_torch(d.train)))) == {"x", "y"}


def test_to_torch_converts_one_batch_zero_copy(ds) -> None:
    d, x = ds
    it = iter(d.infer((0, 10), batch_size=5))
    batch = next(it)
    tensors = to_torch(batch)
    assert set(tensors) == {"x", "y"}
    assert tensors["x"].data_ptr() == batch.arrays["x"].ctypes.data
    np.testing.assert_array_equal(tensors["y"].numpy(), x[batch.sample_indices + 2])
    assert to_torch(batch, device="cpu")["x"].device.type == "cpu"
    it.close()
    with pytest.raises(TypeError, match="Batch"):
        to_torch({"x": np.zeros(3)})
    with pytest.raises(ValueError, match="device"):
        to_torch(batch, device="nonsense")
    train_batch = next(iter(d.train))
    assert isinstance(train_batch, Batch) and set(to_torch(train_batch)) == {"x", "y"}


def test_all_view_is_every_chunk_in_order(ds) -> None:
    d, x = ds
    assert d.all is d.all
    order = [b.sample_indices for b in d.all]
    flat = np.concatenate(order)
    np.testing.assert_array_equal(flat, np.arange(46))  # every anchor whose y window fits, in storage order
    assert len(d.all) == len(order) == -(-46 // 5)
    again = np.concatenate([b.sample_indices for b in d.all])
    np.testing.assert_array_equal(again, flat)
    for batch in d.all:
        np.testing.assert_array_equal(batch.arrays["x"], x[batch.sample_indices])
        break
    assert d.all.state_dict()["split"] == "__all__"


def test_all_view_spans_every_split(tmp_path) -> None:
    root = zarr.open_group(tmp_path / "s.zarr", mode="w")
    x = np.arange(40 * 3, dtype="f4").reshape(40, 3)
    root.create_array("x", shape=x.shape, chunks=(4, 3), dtype="f4")[:] = x
    g = open_geometries(str(tmp_path / "s.zarr"))["x"]
    manifest = split_by_chunk(g, fractions=(0.5, 0.25, 0.25), contiguous=False, seed=3)
    with InSituDataset(str(tmp_path / "s.zarr"), manifest, batch_size=7, shuffle=True) as d:
        train = np.concatenate([b.sample_indices for b in d.train])
        everything = [b for b in d.all]
        flat = np.concatenate([b.sample_indices for b in everything])
        np.testing.assert_array_equal(flat, np.arange(40))
        for b in everything:
            np.testing.assert_array_equal(b.arrays["x"], x[b.sample_indices])
    assert len(train) == 20 and not np.array_equal(train, np.sort(train))  # train alone is a shuffled half
