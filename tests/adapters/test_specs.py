"""Adapters know their items before the first batch: ``spec``/``last_spec`` from the views' geometries.

Checked against the batches the adapters then yield: plain, shifted and
windowed labels, a selection, a chunk transform that drops an axis, a
batch transform that declares what it makes, statics, and the short last
batch; ``jax.jit(...).lower(spec)`` before iterating; JAX device placement
and ``device_transform``; an unknown device.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, JaxView, applies, as_torch, open_geometries, split_by_chunk, to_jax

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

N, LAT, LON = 50, 6, 8  # 50 samples in chunks of 6; batches of 8 leave a short last one


class MeanLon:
    """A rank-changing chunk transform: ``(n, lat, lon) -> (n, lat)``."""

    cache_key = "test/spec-mean-lon/v1"

    def output_inner(self, g):
        return g.inner_shape[:-1], g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.mean(axis=-1, dtype=chunk.data.dtype))


class Anomaly:
    """A batch transform that adds a label and says so: ``output_rows`` gives its row shape and dtype."""

    def output_rows(self, rows):
        shape, _ = rows["x"]
        return {**rows, "anomaly": (shape, np.dtype("f8"))}

    def __call__(self, batch):
        x = batch.arrays["x"]
        batch.arrays["anomaly"] = (x - x.mean()).astype("f8")
        return batch


def _thin(batch):
    """A batch transform that changes a label's rows without declaring it."""
    batch.arrays["x"] = batch.arrays["x"][:, :2]
    return batch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "s.zarr"
    root = zarr.open_group(path, mode="w")
    rng = np.random.default_rng(11)
    for name, shape, chunks, dtype, dims in (
        ("x", (N, LAT, LON), (6, LAT, 4), "f4", ("t", "lat", "lon")),
        ("z", (N, LAT, LON), (6, LAT, LON), "f4", ("t", "lat", "lon")),
        ("w", (N, LAT), (6, LAT), "f8", ("t", "lat")),
        ("mask", (LAT, LON), (LAT, LON), "i2", ("lat", "lon")),
    ):
        arr = root.create_array(name, shape=shape, chunks=chunks, dtype=dtype, dimension_names=dims)
        arr[:] = (rng.random(shape) * 10).astype(dtype)
    return str(path)


def _dataset(store, **kw):
    g = open_geometries(store, variables=["x", "z", "w"])
    x = g["x"]
    variables = {
        "x": x,
        "later": x.shift(2),
        "steps": x.window([-1, 0, 1]),
        "box": x.isel(lat=slice(1, 4), lon=[0, 5]),
        "zonal": g["z"],  # (lat, lon) -> (lat) by MeanLon
        "w": g["w"],
    }
    kw.setdefault("batch_size", 8)
    return InSituDataset(
        store,
        split_by_chunk(x, fractions=(0.75, 0.25)),
        variables,
        statics=["mask"],
        block_chunks=2,
        chunk_transforms=[applies(["z"], MeanLon())],
        **kw,
    )


def _shapes(item) -> dict:
    return {label: (tuple(a.shape), np.dtype(a.dtype)) for label, a in item.items()}


def test_jax_spec_is_every_label_of_the_first_and_last_batch(store) -> None:
    with _dataset(store) as ds:
        jv = to_jax(ds.train)
        assert isinstance(jv, JaxView)
        spec, last = jv.spec, jv.last_spec
        items = list(jv)
    assert len(items) == len(jv) >= 2
    want = {k: (s.shape, np.dtype(s.dtype)) for k, s in spec.items()}
    assert _shapes(items[0]) == want
    assert _shapes(items[-1]) == {k: (s.shape, np.dtype(s.dtype)) for k, s in last.items()}
    assert want["steps"] == ((8, 3, LAT, LON), np.dtype("f4"))
    assert want["box"] == ((8, 3, 2), np.dtype("f4"))
    assert want["zonal"] == ((8, LAT), np.dtype("f4"))  # the chunk transform dropped an axis
    assert want["w"] == ((8, LAT), np.dtype("f4"))  # float64 is float32 in JAX unless x64 is on
    assert want["mask"] == ((LAT, LON), np.dtype("i2"))  # statics: no batch dimension
    assert last["x"].shape[0] == items[-1]["x"].shape[0] < 8
    assert all(s.sharding.device_set == {jax.devices("cpu")[0]} for s in spec.values())


def test_jit_lowers_from_the_spec_before_the_first_byte_moves(store) -> None:
    def step(batch):
        return jnp.mean(batch["later"] - batch["x"]) + jnp.sum(batch["steps"][:, 1] * batch["mask"])

    with _dataset(store) as ds:
        jv = to_jax(ds.train)
        full = jax.jit(step).lower(jv.spec).compile()
        short = jax.jit(step).lower(jv.last_spec).compile()
        assert ds.gets == 0  # compiled from metadata alone: nothing was fetched
        out = []
        for k, arrays in enumerate(jv):
            compiled = full if k < len(jv) - 1 else short  # an AOT-compiled step accepts only its own shapes
            out.append((float(compiled(arrays)), float(step(arrays))))
    assert out and all(np.isclose(a, b) for a, b in out)


def test_torch_spec_matches_its_tensors(store) -> None:
    torch = pytest.importorskip("torch")
    with _dataset(store) as ds:
        tv = as_torch(ds.train)
        spec, last = tv.spec, tv.last_spec
        items = list(tv)
    assert {k: (t.shape, t.dtype) for k, t in items[0].items()} == spec
    assert {k: (t.shape, t.dtype) for k, t in items[-1].items()} == last
    assert spec["w"] == (torch.Size([8, LAT]), torch.float64) and spec["steps"][0] == (8, 3, LAT, LON)
    assert spec["zonal"][0] == (8, LAT) and spec["mask"] == (torch.Size([LAT, LON]), torch.int16)


def test_a_view_that_fills_its_batches_has_one_spec(store) -> None:
    with _dataset(store, batch_size=1) as ds:
        jv = to_jax(ds.val)
        assert jv.spec == jv.last_spec and jv.spec["x"].shape == (1, LAT, LON)


def test_inference_views_and_pairs_have_specs_too(store) -> None:
    with _dataset(store) as ds:
        jv = to_jax(ds.infer((1, 20), batch_size=7))
        spec, last = jv.spec, jv.last_spec
        items = list(jv)
    assert [a["x"].shape[0] for a, _ in items] == [7, 7, 5]
    assert (spec["x"].shape[0], last["x"].shape[0]) == (7, 5)
    assert _shapes(items[-1][0]) == {k: (v.shape, np.dtype(v.dtype)) for k, v in last.items()}


def test_a_batch_transform_declares_its_rows(store) -> None:
    with _dataset(store, batch_transforms=[Anomaly()]) as ds:
        jv = to_jax(ds.train)
        assert jv.spec["anomaly"].shape == (8, LAT, LON) and jv.spec["anomaly"].dtype == jnp.float32
        assert _shapes(next(iter(jv))) == {k: (v.shape, np.dtype(v.dtype)) for k, v in jv.spec.items()}
        tv = as_torch(ds.train)
        assert tv.spec["anomaly"][1] == pytest.importorskip("torch").float64


def test_a_batch_transform_that_changes_rows_silently_fails_loudly_once_a_spec_was_taken(store) -> None:
    with _dataset(store, batch_transforms=[_thin]) as ds:
        assert len(list(to_jax(ds.val))) == len(ds.val)  # no spec asked for: nothing was promised
        jv = to_jax(ds.val)
        assert jv.spec["x"].shape == (8, LAT, LON)  # what the geometry says: _thin declares nothing
        with pytest.raises(ValueError, match=r"batch 0 differs from the view's spec at \['x'\].*output_rows"):
            list(jv)
        tv = as_torch(ds.val)
        assert tv.spec["x"][0] == (8, LAT, LON)
        with pytest.raises(ValueError, match="output_rows"):
            list(tv)


# -- devices --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", [None, "cpu", "CPU:0", 0, "jax-device"])
def test_batches_are_placed_on_the_device_asked_for(store, device) -> None:
    cpu = jax.devices("cpu")[0]
    with _dataset(store) as ds:
        jv = to_jax(ds.val, device=cpu if device == "jax-device" else device)
        assert jv.device == cpu
        for arrays in jv:
            assert {d for a in arrays.values() for d in a.devices()} == {cpu}


def test_device_transform_runs_on_the_placed_batch(store) -> None:
    @jax.jit
    def normalise(batch):
        return {**batch, "x": (batch["x"] - 5.0) / 3.0, "speed": jnp.hypot(batch["x"], batch["later"])}

    with _dataset(store) as ds:
        numpy_batches = [(b.arrays["x"].copy(), b.arrays["later"].copy()) for b in ds.train]
        jv = to_jax(ds.train, device="cpu", device_transform=normalise)
        after = jax.eval_shape(normalise, jv.spec)  # the items' shapes, from the spec, before any batch
        items = list(jv)
    assert _shapes(items[0]) == {k: (v.shape, np.dtype(v.dtype)) for k, v in after.items()}
    for (x, later), arrays in zip(numpy_batches, items, strict=True):
        np.testing.assert_allclose(np.asarray(arrays["x"]), (x - 5.0) / 3.0, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(arrays["speed"]), np.hypot(x, later), rtol=1e-6)


@pytest.mark.parametrize(
    ("device", "exc", "match"),
    [
        ("gpu", ValueError, r"device='gpu' is not available: JAX has no 'gpu' backend here .*; devices: .*cpu"),
        ("cuda:0", ValueError, r"device='cuda:0' is not available: JAX has no 'cuda' backend"),
        ("tpu:1", ValueError, r"device='tpu:1' is not available"),
        ("cpu:7", ValueError, r"device='cpu:7' is not available: the cpu platform has 1 device\(s\)"),
        (9, ValueError, r"device=9 is not available"),
        ("cpu:x", ValueError, r"device='cpu:x' must be a platform and an index"),
        ("quantum", ValueError, r"device='quantum' is not available"),
        (1.5, TypeError, "device must be a jax.Device"),
    ],
)
def test_an_unknown_device_names_itself_and_the_devices_there_are(store, device, exc, match) -> None:
    if device in ("gpu", "cuda:0") and any(d.platform == "gpu" for d in jax.devices()):
        return  # a GPU machine: these are real devices (bench/gpu_check.py runs there)
    with _dataset(store) as ds:
        with pytest.raises(exc, match=match):
            to_jax(ds.val, device=device)


def test_to_jax_checks_its_arguments(store) -> None:
    with _dataset(store) as ds:
        with pytest.raises(TypeError, match="DatasetView"):
            to_jax(ds)
        with pytest.raises(TypeError, match="device_transform must be callable"):
            to_jax(ds.val, device_transform=3)
        with pytest.raises(TypeError, match="coords must be"):
            to_jax(ds.val, coords="yes")
