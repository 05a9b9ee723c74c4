"""The Keras 3 recipe (``examples/keras_train.py``) trains on the torch and on the JAX backend.

Keras fixes its backend at its first import, so each backend runs in its own
interpreter, with a hard timeout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from insitubatch.tools.demo import write_demo_dataset

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "keras_train.py"
# keras + backend import and a few tens of steps on a loaded 2-core machine
RUN_TIMEOUT_S = 300
SAMPLES, BATCH, EPOCHS = 640, 32, 2
STEPS = int(SAMPLES * 0.9) // BATCH  # the train split's batches (0.9 of the samples, whole chunks)


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory) -> str:
    return str(write_demo_dataset(tmp_path_factory.mktemp("demo") / "era5_demo.zarr"))


def _needs(backend: str) -> pytest.MarkDecorator:
    # found, not imported: keras would pick its default backend here
    missing = [p for p in ("keras", backend) if importlib.util.find_spec(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"the recipe needs {', '.join(missing)}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param(b, marks=_needs(b)) for b in ("torch", "jax")])
def test_keras_trains_from_the_backend_s_adapter(backend: str, demo_path: str, tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    env.pop("KERAS_BACKEND", None)  # the script sets it from --backend
    args = ["--backend", backend, "--path", demo_path, "--epochs", str(EPOCHS), "--samples", str(SAMPLES)]
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE), *args, "--batch-size", str(BATCH)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    epochs = re.findall(r"epoch (\d+): (\d+) steps, loss ([\d.]+)", proc.stdout)
    assert [int(e) for e, _, _ in epochs] == list(range(EPOCHS))
    assert all(int(steps) == STEPS for _, steps, _ in epochs)  # Keras's epoch is the view's pass
    losses = [float(loss) for _, _, loss in epochs]
    assert losses[-1] < losses[0]  # it learns
    assert f"backend {backend}: trained {EPOCHS} epochs of {STEPS} batches" in proc.stdout
