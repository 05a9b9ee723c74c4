"""to_jax(view, sharding=...): global jax.Arrays over 4 host devices and over 2 processes, values equal zarr's.

Each check runs in a fresh interpreter (``jax_sharding_child.py``): the
host device count and ``jax.distributed.initialize`` must precede JAX's
backends. Children get hard timeouts; processes meet on loopback only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from servers import free_port

from insitubatch import InSituDataset, open_geometries, split_by_chunk, to_jax

pytest.importorskip("jax")

CHILD = Path(__file__).with_name("jax_sharding_child.py")
ROOT = Path(__file__).resolve().parents[2]
# spawn + JAX import + a few small passes on a loaded 2-core machine
CHILD_TIMEOUT_S = 240
SAMPLES = 44  # batches of 8: the last holds 4 (one pass), 4 per rank of two (the other)
BATCH = 8


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "data.zarr"
    root = zarr.open_group(path, mode="w")
    x = root.create_array("x", shape=(SAMPLES, 3, 4), chunks=(4, 3, 4), dtype="float32")
    x[:] = np.arange(SAMPLES * 12, dtype=np.float32).reshape(SAMPLES, 3, 4)
    land = root.create_array("land", shape=(3, 4), chunks=(3, 4), dtype="float32")
    land[:] = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    return str(path)


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _start(args: list[str], devices: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env=_env(devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> None:
    try:
        out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the child did not finish in {CHILD_TIMEOUT_S} s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]


@pytest.mark.slow
def test_a_global_batch_over_four_devices_places_each_device_s_rows(store: str, tmp_path: Path) -> None:
    result = tmp_path / "devices.json"
    _finish(_start(["devices", store, str(result)], devices=4))
    out = json.loads(result.read_text())
    assert out["samples"] == list(range(SAMPLES))  # every sample once, in global arrays equal to zarr's rows
    assert "does not split evenly" in out["uneven"] and "batch_size" in out["uneven"]
    print(out["layout"])


@pytest.mark.slow
def test_two_processes_make_one_global_batch_with_ranks_from_jax(store: str, tmp_path: Path) -> None:
    port = free_port()
    results = [tmp_path / f"process{i}.json" for i in range(2)]
    procs = [_start(["processes", store, str(results[i]), str(i), str(port)], devices=2) for i in range(2)]
    try:
        for proc in procs:
            _finish(proc)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outs = [json.loads(r.read_text()) for r in results]
    seen = outs[0]["samples"] + outs[1]["samples"]
    assert set(outs[0]["samples"]).isdisjoint(outs[1]["samples"])  # ranks split the chunks
    assert sorted(set(seen)) == list(range(SAMPLES))  # together, every sample
    assert len(outs[0]["global_sums"]) == len(outs[1]["global_sums"])  # the same batch count: no hang
    for a, b in zip(outs[0]["global_sums"], outs[1]["global_sums"]):
        assert a == b  # one global array: both processes computed the same total
    expected = [l0 + l1 for l0, l1 in zip(outs[0]["local_sums"], outs[1]["local_sums"])]
    np.testing.assert_allclose(outs[0]["global_sums"], expected, rtol=1e-5)  # over both processes' real rows


@pytest.fixture
def dataset(store: str):
    geoms = open_geometries(store, variables=["x"])
    with InSituDataset(store, split_by_chunk(geoms["x"], fractions=(1.0,)), {"x": geoms["x"]}, batch_size=BATCH) as ds:
        yield ds


def _one_device_sharding():
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), PartitionSpec("data"))


def test_kept_global_arrays_survive_the_batch_buffers_reuse(dataset, store: str) -> None:
    x = zarr.open_array(store, path="x", mode="r")[:]
    orders = [b.sample_indices.copy() for b in dataset.train]
    kept = list(to_jax(dataset.train, sharding=_one_device_sharding(), mask="valid"))  # none dropped until the end
    for _ in dataset.train:  # another pass takes whatever buffers are free and overwrites them
        pass
    assert len(kept) == len(orders) == -(-SAMPLES // BATCH)
    for arrays, idx in zip(kept, orders):
        n = len(idx)
        np.testing.assert_array_equal(np.asarray(arrays["x"])[:n], x[idx])
        np.testing.assert_array_equal(np.asarray(arrays["x"])[n:], np.repeat(x[idx[-1:]], BATCH - n, axis=0))
        assert np.asarray(arrays["valid"]).sum() == n and arrays["x"].shape == (BATCH, 3, 4)


def test_sharding_arguments_are_checked(dataset) -> None:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    with pytest.raises(TypeError, match="not both"):
        to_jax(dataset.train, device="cpu", sharding=_one_device_sharding())
    with pytest.raises(TypeError, match="needs sharding="):
        to_jax(dataset.train, mask="valid")
    with pytest.raises(TypeError, match="NamedSharding"):
        to_jax(dataset.train, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    with pytest.raises(ValueError, match="mask='x' is a label"):
        to_jax(dataset.train, sharding=_one_device_sharding(), mask="x")
    # a spec whose batch axis names a mesh axis of 1 device: valid, the whole batch on it
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    view = to_jax(dataset.train, sharding=NamedSharding(mesh, PartitionSpec("data", "model")))
    assert view.spec["x"].shape == (BATCH, 3, 4) and view.device is None


def test_jax_not_initialised_for_several_processes_leaves_ranks_to_the_environment(monkeypatch) -> None:
    import jax

    from insitubatch.plan.distributed import resolve_world

    assert not jax.distributed.is_initialized()  # imported, one process: JAX has no say
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_world(None, None) == (1, 2)
