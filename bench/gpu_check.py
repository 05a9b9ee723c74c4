"""The GPU check: ``as_torch`` and ``to_jax`` on a CUDA device against CPU results, host-to-device overlap measured.

Run it on a machine with a CUDA device (it needs torch with CUDA; JAX with a
GPU backend for the JAX rows)::

    python -m bench.gpu_check                 # prints a table; exits 1 if a check fails
    python -m bench.gpu_check --device cpu    # the same plumbing on the CPU: a dry run anywhere

Without a CUDA device it prints why it skips and exits 0. The checks, on a
locally written ERA5-like dataset (a few MB per batch, so copies take
measurable time):

* **torch values**: every batch of ``as_torch(view, device="cuda")`` equals
  the CPU batch of the same epoch, and a ``device_transform`` computed on
  the device equals the same arithmetic on the CPU.
* **in flight**: every device tensor of the pass is kept until the end and
  compared then, under a slow consumer, so a host buffer reused while its
  copy was still in flight would show as a wrong value.
* **pinned**: with a CUDA device, batch buffers come from page-locked memory.
* **overlap**: a pass with a GPU step per batch against the same copies and
  steps run one after another; the share of the shorter of (copy, step)
  hidden by the asynchronous copy one batch ahead (1.0: fully hidden).
* **jax values**: ``to_jax(view, device=<gpu>)`` against the CPU batches,
  and the arrays' device.
* **cuda tests**: ``tests/adapters/test_adapters_cuda.py``, which skip
  everywhere else, run here and must pass.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CUDA_TESTS = ROOT / "tests" / "adapters" / "test_adapters_cuda.py"
# 64 MB per batch (32 samples of four 256 x 512 float32 fields): a copy takes milliseconds over
# PCIe, well above the per-batch Python overhead the overlap measurement must not be about.
SAMPLES = 256
GRID = (256, 512)
SAMPLES_PER_CHUNK = 16
BATCH_SIZE = 32
# The overlap check's step: about as long as one batch's copy, so either could hide the other.
STEP_OVER_COPY = 1.0
EXIT_FAILED = 1


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # PASS, FAIL, SKIP or n/a
    detail: str


def _dataset(path: Path) -> Any:
    from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk

    store = obstore_store(path, read_only=True)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(1.0,))
    variables = {**geoms, "target": geoms["t2m"].shift(1)}
    # a budget that holds everything: passes after the first are served from memory, so the loader's
    # own cost stays out of the overlap measurement
    return InSituDataset(store, manifest, variables, batch_size=BATCH_SIZE, cache_budget_bytes=1 << 31, seed=1)


def _cpu_reference(path: Path) -> list[dict[str, np.ndarray]]:
    with _dataset(path) as ds:
        return [{k: np.array(v) for k, v in batch.arrays.items()} for batch in ds.train]


def _equal(got: Any, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.array_equal(np.asarray(got), want))


def check_torch(path: Path, device: str, reference: list[dict[str, np.ndarray]]) -> list[Row]:
    import torch

    from insitubatch import as_torch

    rows = []
    cuda = device.startswith("cuda")
    with _dataset(path) as ds:
        tv = as_torch(ds.train, device=device, device_transform=lambda b: {**b, "delta": b["target"] - b["t2m"]})
        kept = []
        for tensors in tv:  # every tensor kept: a reused host buffer would corrupt a copy still in flight
            if cuda:
                torch.cuda._sleep(1_000_000)  # a slow consumer: the next copy is issued while this one waits
            kept.append(tensors)
        if cuda:
            torch.cuda.synchronize()
        bad = [
            (i, k)
            for i, (got, want) in enumerate(zip(kept, reference))
            for k in want
            if not _equal(got[k].cpu().numpy(), want[k])
        ]
        delta = [
            i
            for i, (got, want) in enumerate(zip(kept, reference))
            if not _equal(got["delta"].cpu().numpy(), want["target"] - want["t2m"])
        ]
        on_device = all(t.device.type == torch.device(device).type for b in kept for t in b.values())
        n = len(kept)
        ok = n == len(reference) and not bad and not delta and on_device
        rows.append(
            Row(
                "torch values",
                "PASS" if ok else "FAIL",
                f"{n} batches on {device} equal the CPU's" + ("" if ok else f"; differ: {bad[:3]}, delta {delta[:3]}"),
            )
        )
        rows.append(
            Row(
                "in flight",
                ("PASS" if not bad else "FAIL") if cuda else "n/a",
                "every device tensor kept to the end under a slow consumer, none overwritten"
                if cuda
                else "no asynchronous copy on the CPU",
            )
        )
        if cuda:
            it = iter(ds.train)
            batch = next(it)
            pinned = all(torch.from_dlpack(a).is_pinned() for a in batch.arrays.values())
            it.close()
            rows.append(Row("pinned", "PASS" if pinned else "FAIL", "batch buffers are page-locked"))
        else:
            rows.append(Row("pinned", "n/a", "page-locked buffers only with a CUDA device"))
    return rows


def _timed(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def check_overlap(path: Path, device: str) -> Row:
    """Copies hidden behind GPU steps: the pipelined pass against copy-then-step, one batch at a time."""
    import torch

    from insitubatch import as_torch

    if not device.startswith("cuda"):
        return Row("overlap", "n/a", "host-to-device overlap needs a CUDA device")
    sync = torch.cuda.synchronize
    with _dataset(path) as ds:
        tv = as_torch(ds.train, device=device)
        for _ in tv:  # warm: the pool now holds the split, buffers are pinned and allocated
            pass
        host = [{k: torch.from_dlpack(v).clone().pin_memory() for k, v in b.arrays.items()} for b in ds.train]
        n = len(host)
        copy_s = _timed(lambda: [{k: t.to(device) for k, t in b.items()} for b in host], sync) / n
        # calibrate a GPU busy-wait to about one copy
        cycles = 1_000_000
        per = _timed(lambda: torch.cuda._sleep(cycles), sync)
        cycles = max(1, int(cycles * STEP_OVER_COPY * copy_s / per))
        step_s = _timed(lambda: torch.cuda._sleep(cycles), sync)

        def serial() -> None:
            for b in ds.train:
                _copies = {k: torch.from_dlpack(v).to(device) for k, v in b.arrays.items()}  # blocking copies
                torch.cuda._sleep(cycles)
                sync()

        def pipelined() -> None:
            for _tensors in tv:
                torch.cuda._sleep(cycles)

        serial_s = _timed(serial, sync)
        pipelined_s = _timed(pipelined, sync)
    hidden = (serial_s - pipelined_s) / (n * min(copy_s, step_s)) if min(copy_s, step_s) > 0 else 0.0
    detail = (
        f"{n} batches: copy {copy_s * 1e3:.2f} ms, step {step_s * 1e3:.2f} ms per batch; serial "
        f"{serial_s:.3f} s, pipelined {pipelined_s:.3f} s; {hidden:.2f} of the shorter hidden"
    )
    return Row("overlap", "PASS" if hidden > 0.5 else "FAIL", detail)


def check_jax(path: Path, device: str, reference: list[dict[str, np.ndarray]]) -> Row:
    if importlib.util.find_spec("jax") is None:
        return Row("jax values", "SKIP", "jax is not installed (pip install 'insitubatch[jax]')")
    import jax

    from insitubatch import to_jax

    platform = "gpu" if device.startswith("cuda") else "cpu"
    try:
        target = jax.devices(platform)[0]
    except RuntimeError as exc:
        return Row("jax values", "SKIP", f"JAX has no {platform} backend here ({exc})")
    with _dataset(path) as ds:
        kept = list(to_jax(ds.train, device=target))
    bad = [i for i, (got, want) in enumerate(zip(kept, reference)) for k in want if not _equal(got[k], want[k])]
    placed = all(a.devices() == {target} for b in kept for a in b.values())
    ok = len(kept) == len(reference) and not bad and placed
    return Row("jax values", "PASS" if ok else "FAIL", f"{len(kept)} batches on {target} equal the CPU's")


def check_cuda_tests(device: str) -> Row:
    if not device.startswith("cuda"):
        return Row("cuda tests", "n/a", f"{CUDA_TESTS.relative_to(ROOT)} skip without a CUDA device")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(CUDA_TESTS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
    ok = proc.returncode == 0 and "skipped" not in summary
    return Row("cuda tests", "PASS" if ok else "FAIL", summary)


def _no_cuda_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install 'insitubatch[torch]')"
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


@contextlib.contextmanager
def _data(samples: int, grid: tuple[int, int]) -> Iterator[Path]:
    from insitubatch.tools.demo import write_demo_dataset

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        yield write_demo_dataset(
            Path(tmp) / "gpu_check.zarr", shape=(samples, *grid), chunks=(SAMPLES_PER_CHUNK, *grid)
        )


def run(device: str, samples: int = SAMPLES, grid: tuple[int, int] = GRID) -> list[Row]:
    rows: list[Row] = []
    with _data(samples, grid) as path:
        reference = _cpu_reference(path)
        rows += check_torch(path, device, reference)
        rows.append(check_overlap(path, device))
        rows.append(check_jax(path, device, reference))
    rows.append(check_cuda_tests(device))
    return rows


def print_table(rows: list[Row]) -> None:
    width = max(len(r.check) for r in rows)
    print(f"{'check':<{width}}  {'result':<6}  detail")
    for r in rows:
        print(f"{r.check:<{width}}  {r.status:<6}  {r.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="cuda", help="torch device to check (default: cuda; 'cpu' is a dry run of the plumbing)"
    )
    parser.add_argument("--samples", type=int, default=SAMPLES, help=f"time steps written (default: {SAMPLES})")
    parser.add_argument(
        "--grid", type=int, nargs=2, default=GRID, metavar=("LAT", "LON"), help=f"field shape (default: {GRID})"
    )
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        reason = _no_cuda_reason()
        if reason is not None:
            print(f"gpu check skipped: {reason}")
            return 0
    elif importlib.util.find_spec("torch") is None:
        print("gpu check skipped: torch is not installed (pip install 'insitubatch[torch]')")
        return 0
    rows = run(args.device, args.samples, tuple(args.grid))
    print_table(rows)
    return EXIT_FAILED if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
