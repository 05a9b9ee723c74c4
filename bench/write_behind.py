"""Inference that writes its predictions: synchronous writes against write-behind, in one run.

``python -m bench.write_behind [--samples N] [--grid G] [--batch-size B] [--depth D] [--rounds R] [--json FILE]``

Writes an ERA5-like input (``insitubatch.tools.demo``, ``N`` steps of
``G``×``2G``) to a temp dir, then runs the same inference pass over it
several times: ``ds.infer`` reads each batch, a "model" computes, and a
``SlotWriter`` writes the batch's predictions into a fresh zstd-compressed
output group (one chunk per batch). The model is a sleep as long as one
synchronous write of a batch, measured first (the median of a few): it
stands for a GPU step, which leaves the CPU and the GIL to the writer. A
synchronous pass pays model + write per batch; with ``write_behind=D`` the
write of one batch overlaps the model of the next, so the ideal ratio
``synchronous / write-behind`` is 2. Rounds alternate the two kinds; the
figure is the median ratio over back-to-back pairs. Both outputs are
checked equal before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.tools.demo import write_demo_dataset
from insitubatch.write import LayoutSpec, OutputArray, SlotWriter, create_layout

DEFAULT_SAMPLES = 1024
DEFAULT_GRID = 128
DEFAULT_BATCH = 32
# two batches held: one being written while the next is computed, one more to absorb jitter
DEFAULT_DEPTH = 2
DEFAULT_ROUNDS = 3
# synchronous writes timed to size the model
CALIBRATION_WRITES = 5


def _output(path: Path, like: zarr.Array, batch_size: int) -> LocalStore:
    store = LocalStore(path)
    n, *field = like.shape
    spec = LayoutSpec((OutputArray("pred", (n, *field), (batch_size, *field), "float32"),))
    create_layout(store, spec)
    return store


def _predict(x: np.ndarray) -> np.ndarray:
    """What the model returns: a cheap function of the input, so outputs can be compared."""
    return (x * np.float32(0.5) + np.float32(1.0)).astype(np.float32)


def _pass(data: Path, out: Path, batch_size: int, model_s: float, depth: int) -> float:
    """One inference pass writing every prediction; wall seconds, writes included."""
    source = LocalStore(data, read_only=True)
    t2m = open_geometries(source)["t2m"]
    store = _output(out, zarr.open_array(source, path="t2m", mode="r"), batch_size)
    began = time.perf_counter()
    with InSituDataset(source, split_by_chunk(t2m, fractions=(1.0,)), {"t2m": t2m}, batch_size=batch_size) as ds:
        with SlotWriter(store, 0, t2m.shape[0], write_behind=depth) as writer:
            for batch in ds.infer((0, t2m.shape[0])):
                time.sleep(model_s)  # the model's step
                lo = int(batch.sample_indices[0])
                writer.write("pred", (lo, lo + len(batch)), _predict(batch.arrays["t2m"]))
    return time.perf_counter() - began


def _write_seconds(data: Path, out: Path, batch_size: int) -> float:
    """Median seconds of one synchronous write of a batch's predictions."""
    x = zarr.open_array(LocalStore(data, read_only=True), path="t2m", mode="r")
    store = _output(out, x, batch_size)
    times = []
    with SlotWriter(store, 0, x.shape[0]) as writer:
        for i in range(max(1, min(CALIBRATION_WRITES, x.shape[0] // batch_size))):
            lo = i * batch_size
            values = _predict(x[lo : lo + batch_size])
            began = time.perf_counter()
            writer.write("pred", (lo, lo + batch_size), values)
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure(data: Path, tmp: Path, *, batch_size: int, depth: int, rounds: int) -> dict[str, Any]:
    """Time ``rounds`` synchronous and write-behind passes, alternating; outputs checked equal."""
    write_s = _write_seconds(data, tmp / "calibrate.zarr", batch_size)
    sync_s, behind_s = [], []
    for r in range(rounds):
        sync_s.append(_pass(data, tmp / f"sync{r}.zarr", batch_size, write_s, depth=0))
        behind_s.append(_pass(data, tmp / f"behind{r}.zarr", batch_size, write_s, depth=depth))
    for r in range(rounds):
        a = zarr.open_array(LocalStore(tmp / f"sync{r}.zarr"), path="pred", mode="r")[:]
        b = zarr.open_array(LocalStore(tmp / f"behind{r}.zarr"), path="pred", mode="r")[:]
        if not np.array_equal(a, b):
            raise AssertionError(f"round {r}: the write-behind output differs from the synchronous one")
    return {
        "batch_size": batch_size,
        "depth": depth,
        "batches": -(-zarr.open_array(LocalStore(data, read_only=True), path="t2m", mode="r").shape[0] // batch_size),
        "write_s": write_s,
        "sync_s": sync_s,
        "behind_s": behind_s,
        "ratio": statistics.median(s / b for s, b in zip(sync_s, behind_s)),
    }


def _table(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"{result['batches']} batches of {result['batch_size']}, model = one write = "
            f"{result['write_s'] * 1e3:.1f} ms, write_behind={result['depth']}",
            f"synchronous   best {min(result['sync_s']):.3f} s  median {statistics.median(result['sync_s']):.3f} s",
            f"write-behind  best {min(result['behind_s']):.3f} s  median {statistics.median(result['behind_s']):.3f} s",
            f"synchronous / write-behind (median of pairs): {result['ratio']:.2f}  (ideal 2.00)",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.write_behind", description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--grid", type=int, default=DEFAULT_GRID)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--depth", type=int, default=DEFAULT_DEPTH)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="insitu-write-behind-") as name:
        tmp = Path(name)
        shape = (args.samples, args.grid, 2 * args.grid)
        data = write_demo_dataset(tmp / "input.zarr", shape=shape, chunks=(args.batch_size, args.grid, args.grid))
        result = measure(data, tmp, batch_size=args.batch_size, depth=args.depth, rounds=args.rounds)
    print(_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
