"""``bench/gpu_check.py``: skips cleanly without a GPU, and its checks run end to end as a CPU dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "bench.gpu_check", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_without_a_cuda_device_it_skips_and_says_why() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():  # a GPU machine: the check itself runs (the device session does that)
        return
    proc = _gpu_check()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu check skipped: no CUDA device")


def test_the_checks_run_as_a_dry_run_on_the_cpu() -> None:
    pytest.importorskip("torch")
    proc = _gpu_check("--device", "cpu", "--samples", "64", "--grid", "32", "64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header, *lines = proc.stdout.splitlines()
    width = header.index("result")  # the table's first column is padded to this
    rows = {line[:width].strip(): line[width:] for line in lines}
    assert "PASS" in rows["torch values"] and "equal the CPU's" in rows["torch values"]
    for cuda_only in ("in flight", "pinned", "overlap", "cuda tests"):
        assert rows[cuda_only].startswith("n/a")
    assert ("PASS" in rows["jax values"]) or ("SKIP" in rows["jax values"])  # leg 2 has no jax
