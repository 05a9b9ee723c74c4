"""What the JAX sharding tests run in a fresh interpreter (no tests here).

``--xla_force_host_platform_device_count`` and ``jax.distributed.initialize``
must come before JAX starts its backends, so each check runs as
``python jax_sharding_child.py MODE STORE RESULT [PROCESS_ID PORT]`` with
``XLA_FLAGS`` set by the test. A child asserts what it can see itself and
writes what the parent compares across processes to ``RESULT`` (JSON).
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout

import jax
import numpy as np
import zarr
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from insitubatch import InSituDataset, open_geometries, split_by_chunk, to_jax

BATCH = 8


def _dataset(store: str, batch_size: int = BATCH, **options) -> InSituDataset:
    geoms = open_geometries(store, variables=["x"])
    manifest = split_by_chunk(geoms["x"], fractions=(1.0,))
    return InSituDataset(store, manifest, {"x": geoms["x"]}, batch_size=batch_size, statics=["land"], **options)


def _orders(ds: InSituDataset) -> list[np.ndarray]:
    """The sample indices of each batch of this epoch of ``ds.train`` (the oracle's row order)."""
    return [batch.sample_indices.copy() for batch in ds.train]


def _check_global(arrays: dict, x: np.ndarray, idx: np.ndarray, sharding: NamedSharding, rows: int) -> None:
    """Global layout by the sharding, each device holding its rows and only those, values equal zarr's."""
    a = arrays["x"]
    assert a.sharding == sharding and a.shape == (rows, *x.shape[1:]), (a.sharding, a.shape)
    valid = np.asarray(arrays["valid"])
    assert valid.tolist() == [True] * len(idx) + [False] * (rows - len(idx)), valid
    padded = np.concatenate([idx, np.repeat(idx[-1:], rows - len(idx))])
    expected = x[padded]
    for shard in a.addressable_shards:
        lo, hi = shard.index[0].start or 0, shard.index[0].stop or rows
        assert shard.data.shape == (hi - lo, *x.shape[1:]) and shard.data.devices() == {shard.device}
        np.testing.assert_array_equal(np.asarray(shard.data), expected[lo:hi])
    land = arrays["land"]
    assert land.sharding.is_fully_replicated and len(land.addressable_shards) == len(sharding.mesh.devices.flat)


def multi_device(store: str) -> dict:
    x = zarr.open_array(store, path="x", mode="r")[:]
    land = zarr.open_array(store, path="land", mode="r")[:]
    devices = jax.devices()
    assert len(devices) == 4 and jax.process_count() == 1, devices
    result: dict = {}
    with _dataset(store) as ds:
        # a 1-D mesh: 2 rows on each of 4 devices; every array kept to the end (batch buffers must not be reused)
        sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
        view = to_jax(ds.train, sharding=sharding, mask="valid")
        assert view.spec["x"].shape == (BATCH, *x.shape[1:]) and view.spec["x"].sharding == sharding
        assert view.last_spec == view.spec  # a short batch is padded to the full global shape
        step = jax.jit(lambda b: (b["x"] * b["valid"][:, None, None]).sum() + b["land"].sum())
        step.lower(view.spec).compile()  # compiles from the spec before the first batch
        orders = _orders(ds)
        kept = list(view)
        assert len(kept) == len(orders) and len(orders[-1]) < BATCH  # the last batch was short
        sums = []
        for arrays, idx in zip(kept, orders):
            _check_global(arrays, x, idx, sharding, BATCH)
            assert [len(s.data) for s in arrays["x"].addressable_shards] == [2, 2, 2, 2]
            sums.append(float(step(arrays)))
            np.testing.assert_allclose(sums[-1], x[idx].sum(dtype=np.float64) + land.sum(), rtol=1e-5)
        out = io.StringIO()
        with redirect_stdout(out):
            jax.debug.visualize_array_sharding(kept[0]["x"][:, 0, 0])
        drawn = out.getvalue()
        assert all(f"CPU {d.id}" in drawn for d in devices), drawn  # one block per device along the batch
        result["layout"] = drawn
        result["samples"] = sorted(int(i) for idx in orders for i in idx)

        # a 2-D mesh sharding the batch over "data" only: each half of the batch on the 2 devices of its row
        mesh2 = Mesh(np.array(devices).reshape(2, 2), ("data", "model"))
        sharding2 = NamedSharding(mesh2, PartitionSpec("data"))
        ds.train.set_epoch(1)
        orders = _orders(ds)
        for arrays, idx in zip(to_jax(ds.train, sharding=sharding2, mask="valid"), orders):
            _check_global(arrays, x, idx, sharding2, BATCH)
            assert [len(s.data) for s in arrays["x"].addressable_shards] == [4, 4, 4, 4]

        # a batch that cannot split evenly over the devices fails before a pass starts
        try:
            to_jax(ds.train, sharding=NamedSharding(Mesh(np.array(devices[:3]), ("data",)), PartitionSpec("data")))
        except ValueError as exc:
            result["uneven"] = str(exc)
    return result


def two_processes(store: str, process_id: int, port: int) -> dict:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    assert jax.process_count() == 2 and jax.process_index() == process_id
    assert len(jax.local_devices()) == 2 and len(jax.devices()) == 4
    x = zarr.open_array(store, path="x", mode="r")[:]
    rows = 2 * BATCH
    with _dataset(store) as ds:
        assert (ds.rank, ds.world_size) == (process_id, 2)  # the ranks are JAX's processes
        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
        view = to_jax(ds.train, sharding=sharding, mask="valid")
        assert view.spec["x"].shape == (rows, *x.shape[1:])
        orders = _orders(ds)
        total = jax.jit(lambda b: (b["x"] * b["valid"][:, None, None]).sum())
        local_sums, global_sums = [], []
        for arrays, idx in zip(view, orders):
            a = arrays["x"]
            assert a.shape == (rows, *x.shape[1:]) and a.sharding == sharding and not a.is_fully_addressable
            mine = sorted((s.index[0].start, s.index[0].stop) for s in a.addressable_shards)
            first = process_id * BATCH  # this process's rows of the global batch: its own batch, 4 per device
            assert mine == [(first, first + 4), (first + 4, first + BATCH)], mine
            padded = np.concatenate([idx, np.repeat(idx[-1:], BATCH - len(idx))])
            for shard in a.addressable_shards:
                lo = shard.index[0].start - process_id * BATCH
                np.testing.assert_array_equal(np.asarray(shard.data), x[padded[lo : lo + 4]])
            valid = np.concatenate([np.asarray(s.data) for s in arrays["valid"].addressable_shards])
            local_sums.append(float(x[idx[valid[: len(idx)]]].sum(dtype=np.float64)))
            global_sums.append(float(total(arrays)))  # a collective over both processes' rows
    jax.distributed.shutdown()
    return {
        "samples": [int(i) for idx in orders for i in idx],
        "local_sums": local_sums,
        "global_sums": global_sums,
    }


def main(argv: list[str]) -> None:
    mode, store, result = argv[:3]
    if mode == "devices":
        out = multi_device(store)
    else:
        out = two_processes(store, int(argv[3]), int(argv[4]))
    with open(result, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1:])
