"""Every example runs, end to end, on the embedded demo dataset (no network)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from servers import free_port

from insitubatch.tools.demo import write_demo_dataset

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory) -> str:
    return str(write_demo_dataset(tmp_path_factory.mktemp("demo") / "era5_demo.zarr"))


def _run(args: list[str], cwd: Path, timeout: float = 300) -> str:
    # the tree under test, not whatever insitubatch the interpreter has installed
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_demo_main_command(demo_path, tmp_path) -> None:
    out = _run(["-m", "insitubatch.tools.demo", "--path", demo_path], tmp_path)
    assert "train epoch 0" in out and "train epoch 1" in out and "val" in out
    # it says what it ran with, and why epoch 1 issues no GET (a budget that holds the split)
    knobs = next(line for line in out.splitlines() if line.startswith("knobs"))
    assert "batch_size=64" in knobs and "block_chunks=8" in knobs and "max_inflight=16" in knobs
    budget = next(line for line in out.splitlines() if line.startswith("budget"))
    assert "cache_budget_bytes=" in budget and "working set" in budget
    epoch1 = next(line for line in out.splitlines() if line.startswith("train epoch 1"))
    assert "GETs    0" in epoch1  # the second epoch is served from the pool


@pytest.mark.slow
def test_train_torch_checkpoint_and_resume(demo_path, tmp_path) -> None:
    pytest.importorskip("torch")
    ckpt = str(tmp_path / "ckpt")
    out = _run(
        [
            str(EXAMPLES / "train_torch.py"),
            "--path",
            demo_path,
            "--checkpoint",
            ckpt,
            "--stop-after",
            "3",
            "--batch-size",
            "128",
        ],
        tmp_path,
    )
    assert "checkpoint after batch 3" in out
    out = _run(
        [
            str(EXAMPLES / "train_torch.py"),
            "--path",
            demo_path,
            "--checkpoint",
            ckpt,
            "--resume",
            "--batch-size",
            "128",
        ],
        tmp_path,
    )
    assert "resumed at batch 3" in out and "epoch done" in out


def test_infer_jax(demo_path, tmp_path) -> None:
    pytest.importorskip("jax")
    out = _run([str(EXAMPLES / "infer_jax.py"), "--path", demo_path, "--start", "10", "--stop", "200"], tmp_path)
    assert "190 samples" in out


def test_random_crop_cuts_zarrs_windows_the_same_way_for_one_seed(demo_path, tmp_path) -> None:
    def run(seed: int, name: str) -> dict[str, np.ndarray]:
        out = tmp_path / name
        args = ["--path", demo_path, "--epochs", "2", "--seed", str(seed), "--crop", "12", "20", "--save", str(out)]
        text = _run([str(EXAMPLES / "random_crop.py"), *args], tmp_path)
        assert "crops (12, 20) per variable" in text
        with np.load(out) as saved:
            return dict(saved)

    first, again, other = run(7, "a.npz"), run(7, "b.npz"), run(8, "c.npz")
    assert set(first) == {"epoch", "batch", "samples", "origins", "crop_t2m", "crop_u10", "crop_v10"}
    for key in first:  # one seed, the same crops: per (seed, epoch, batch index)
        np.testing.assert_array_equal(first[key], again[key], err_msg=key)
    assert not np.array_equal(first["origins"], other["origins"])  # another seed, other windows
    epoch0, epoch1 = first["origins"][first["epoch"] == 0], first["origins"][first["epoch"] == 1]
    assert not np.array_equal(epoch0, epoch1)  # and another epoch too
    root = zarr.open_group(demo_path, mode="r")
    picks = np.random.default_rng(0).choice(len(first["samples"]), size=12, replace=False)
    for variable in ("t2m", "u10", "v10"):
        field = root[variable]
        for i in picks:  # each crop is zarr's own read of that window of that sample
            r, c = first["origins"][i]
            expected = field[int(first["samples"][i]), r : r + 12, c : c + 20]
            np.testing.assert_array_equal(first[f"crop_{variable}"][i], expected)
    # windows vary per sample and cover the field's corners over a few batches
    assert len({tuple(o) for o in first["origins"]}) > len(first["origins"]) // 2
    assert first["origins"].min(axis=0).tolist() == [0, 0] and first["origins"].max(axis=0).tolist() == [20, 44]


@pytest.mark.slow
def test_ddp_train_under_torchrun(demo_path, tmp_path) -> None:
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # the tree under test
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run(
        [
            torchrun,
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(EXAMPLES / "ddp_train.py"),
            "--path",
            demo_path,
            "--batch-size",
            "128",
            "--epochs",
            "2",
            "--cache-dir",
            str(tmp_path / "node-cache"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rank 0/2" in proc.stdout and "rank 1/2" in proc.stdout and "all ranks" in proc.stdout
    # one cache_dir for both ranks: the reshuffled second epoch fetches nothing on either
    assert "rank 0/2 epoch 1:" in proc.stdout and "rank 1/2 epoch 1:" in proc.stdout
    for line in proc.stdout.splitlines():
        if " epoch 1:" in line:
            assert ", 0 GETs" in line, line


@pytest.mark.slow
def test_inference_write(tmp_path) -> None:
    out = _run([str(EXAMPLES / "inference_write.py"), "--dir", str(tmp_path / "run")], tmp_path)
    assert "bit-identical" in out
    xr = pytest.importorskip("xarray")
    # the forecasts were written by valid time: xarray decodes the coordinate and finds every one
    ds = xr.open_zarr(tmp_path / "run" / "outputs.zarr", group="parallel", consolidated=False)
    assert ds["pred"].dims == ("valid_time", "lat", "lon")
    assert ds["valid_time"].values[0] == np.datetime64("2020-01-01T12:00")  # 2 input steps + a 6 h lead
    assert not np.isnan(ds["pred"].sel(valid_time=slice("2020-01-02", "2020-01-03")).values).any()


def test_wb2_dataloader_against_the_local_emulator(tmp_path) -> None:
    pytest.importorskip("torch")
    out = _run([str(EXAMPLES / "wb2_dataloader.py"), "--local", "--local-dir", str(tmp_path / "wb2")], tmp_path)
    assert "epoch 0: first batch" in out and "epoch 1" in out


def _run_without(modules: list[str], script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as ``__main__`` with ``modules`` unimportable (as on a machine without that extra)."""
    blocker = (
        "import runpy, sys\n"
        f"for name in {modules!r}: sys.modules[name] = None\n"
        f"sys.argv = [{str(script)!r}, *{list(args)!r}]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-c", blocker], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    ("script", "missing", "extra"),
    [
        ("train_torch.py", ["torch"], "torch"),
        ("ddp_train.py", ["torch"], "torch"),
        ("wb2_dataloader.py", ["torch"], "torch"),
        ("infer_jax.py", ["jax"], "jax"),
        ("wb2_xbatcher.py", ["xbatcher", "xarray"], "bench"),
    ],
)
def test_an_example_says_which_extra_it_needs(tmp_path, script: str, missing: list[str], extra: str) -> None:
    proc = _run_without(missing, EXAMPLES / script, "--local", cwd=tmp_path)
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    # pip install 'insitubatch[<extras>]' naming this one (others too, where more are missing)
    assert re.search(rf"pip install 'insitubatch\[[\w,]*\b{extra}\b", message) and script in message, proc.stderr


def test_era5_region(tmp_path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("xarray")
    out = _run([str(EXAMPLES / "era5_region.py"), "--path", str(tmp_path / "era5.zarr")], tmp_path)
    reads = next(line for line in out.splitlines() if line.startswith("reads "))
    assert "4 of 32 tiles per chunk" in reads
    gets = int(next(line for line in out.splitlines() if line.startswith("epoch 0")).split(" GETs")[0].split()[-1])
    whole = int(out.split("would cost ")[1].split()[0])
    assert gets < whole / 4  # the selection reads a fraction of the field


@pytest.mark.slow
def test_wb2_xbatcher_compare_runs_every_variant_on_the_local_emulator(tmp_path) -> None:
    # each variant in its own interpreter: DataLoader workers (spawn, forkserver, with preload) and insitubatch
    pytest.importorskip("torch")
    pytest.importorskip("xbatcher")
    args = ["--local", "--compare", "--local-dir", str(tmp_path / "wb2"), "--workers", "1", "--max-batches", "3"]
    out = _run([str(EXAMPLES / "wb2_xbatcher.py"), *args, "--latency-ms", "5"], tmp_path)
    rows = {}
    for line in out.splitlines():
        match = re.match(
            r"(xbatcher \+ DataLoader \S+|insitubatch \(one event loop\))\s+(\d+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)x$", line
        )
        if match:
            rows[match.group(1)] = (
                int(match.group(2)),
                float(match.group(3)),
                int(match.group(4)),
                float(match.group(5)),
            )
    assert set(rows) == {
        "xbatcher + DataLoader spawn",
        "xbatcher + DataLoader forkserver",
        "xbatcher + DataLoader forkserver-preload",
        "insitubatch (one event loop)",
    }, out
    workers, ttfb, rate, ratio = rows["insitubatch (one event loop)"]
    assert workers == 0 and ttfb > 0 and rate > 0 and ratio == 1.0
    assert all(w == 1 and t > 0 and r > 0 for w, t, r, _ in (rows[k] for k in rows if k.startswith("xbatcher")))
