"""Inference with parallel writes by valid time: N worker processes fill one preallocated zarr output group.

What it shows (parallel, chunk-aligned writes; see docs/writes.md):

1. an input archive (here a small synthetic ERA5-like cube with a CF time
   coordinate, written to a temp dir);
2. ``create_layout``: the output arrays at their full, fixed extent, and the
   forecasts' valid times as the index coordinate (CF-encoded, so
   ``xarray.open_zarr`` of the output decodes it), before any worker runs;
3. ``plan_slots``: disjoint ranges aligned to every output array's chunks *and*
   shards, each labelled with its first and last valid time;
4. ``run_plan``: each range runs in a spawn worker process, which reads the
   input windows ending 6 hours before each of its valid times (by date, with
   ``infer(start=, stop=)``), runs a small model and writes each forecast at its
   valid time (``writer.write(..., at=valid_times)``: checked against the
   writer's slot, atomic claim, coverage recorded at the end); the writes are
   made behind the model (``write_behind``: at most that many batches queued
   on the writer's thread while the next one is computed);
5. a single, synchronous writer's run of the same model into a second group,
   and a check that the parallel result is bit-identical to it.

Run it::

    python examples/inference_write.py                 # temp dir, 2 workers
    python examples/inference_write.py --workers 4 --dir /tmp/run
    python examples/inference_write.py --write-behind 0   # synchronous writes in the workers too

On a cluster the same ``work`` function runs under ``dask.distributed``
(pass ``client`` as the executor) or one range per SLURM array task /
Kubernetes indexed Job / torchrun rank: ``insitubatch slots URL --group G``
prints the plan and each task's environment, and a task opens its writer with
``SlotWriter.from_env()``. For object storage pass a store from
``insitubatch.obstore_store("s3://bucket/run.zarr")`` instead of a path.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from zarr.storage import LocalStore

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch.write import (
    LayoutSpec,
    OutputArray,
    SlotWriter,
    create_layout,
    plan_slots,
    run_plan,
    write_status,
)

# Input cube: (time, channel, lat, lon), chunked one day (8 steps) per chunk.
TIMES, CHANNELS, LAT, LON = 96, 4, 16, 32
INPUT_CHUNK = 8
# 3-hourly input steps from here, stored as CF "hours since" integers (what xarray writes).
START, STEP = np.datetime64("2020-01-01T00", "ns"), np.timedelta64(3, "h")
INPUT_TIMES = START + np.arange(TIMES) * STEP
# The model sees WINDOW consecutive steps and forecasts one field LEAD after the last of them.
WINDOW = 3
LEAD = np.timedelta64(6, "h")
# Valid time of each window's forecast: the output's index coordinate.
VALID_TIMES = INPUT_TIMES[WINDOW - 1 :] + LEAD
# Output chunking: inner chunks of 4 steps inside shards of 12. Slots align to 12.
OUT_CHUNK, OUT_SHARD = 4, 12
# Windows per model call inside a worker.
BATCH = 8
HIDDEN = 6
SEED = 0


def make_inputs(path: Path) -> None:
    """A synthetic input archive: smooth fields plus noise."""
    rng = np.random.default_rng(SEED)
    t = np.arange(TIMES)[:, None, None, None]
    c = np.arange(CHANNELS)[None, :, None, None]
    y = np.linspace(0, np.pi, LAT)[None, None, :, None]
    x = np.linspace(0, 2 * np.pi, LON)[None, None, None, :]
    field = np.sin(x + 0.2 * t + c) * np.cos(y) + 0.1 * rng.standard_normal((TIMES, CHANNELS, LAT, LON))
    group = zarr.open_group(LocalStore(path), mode="w")
    arr = group.create_array(
        "x",
        shape=field.shape,
        chunks=(INPUT_CHUNK, CHANNELS, LAT, LON),
        dtype="float32",
        dimension_names=("time", "channel", "lat", "lon"),
    )
    arr[...] = field.astype(np.float32)
    cf = {"units": "hours since 2020-01-01 00:00:00", "calendar": "proleptic_gregorian"}
    time = group.create_array("time", shape=(TIMES,), dtype="int64", dimension_names=("time",), attributes=cf)
    time[...] = (INPUT_TIMES - START) // np.timedelta64(1, "h")


def read_windows(input_path: str, valid: np.ndarray) -> np.ndarray:
    """Input windows for forecasts valid at ``valid``: shape ``(len(valid), WINDOW, C, LAT, LON)``.

    A window is anchored at its first step, ``(WINDOW - 1) * STEP + LEAD``
    before its valid time; the inference pass selects anchors by date (both
    ends inclusive), reads each stored chunk once however many window labels
    (``x0`` = step ``i``, ``x1`` = step ``i + 1``, ...) alias it, and raises
    rather than silently dropping a window that runs off the input.
    """
    store = obstore_store(input_path, read_only=True)
    g = open_geometries(store)["x"]
    labels = {f"x{k}": g.shift(k) for k in range(WINDOW)}
    back = (WINDOW - 1) * STEP + LEAD
    with InSituDataset(store, split_by_chunk(g, fractions=(1.0,)), labels, batch_size=len(valid)) as ds:
        batches = ds.infer(start=valid[0] - back, stop=valid[-1] - back)
        windows = [batch.stack(list(labels), axis=1) for batch in batches]
    return np.concatenate(windows)


def model(windows: np.ndarray) -> np.ndarray:
    """A tiny fixed "network": window mean -> channel mixing -> tanh -> one field per window.

    ``np.einsum`` without BLAS keeps each output's summation order independent
    of the batch size, so any split of the anchors gives identical bits.
    """
    rng = np.random.default_rng(SEED)
    w1 = rng.standard_normal((CHANNELS, HIDDEN))
    w2 = rng.standard_normal(HIDDEN) / HIDDEN
    mean = windows.astype(np.float64).mean(axis=1)  # (n, C, LAT, LON)
    hidden = np.tanh(np.einsum("nchw,ck->nkhw", mean, w1))
    return np.einsum("nkhw,k->nhw", hidden, w2).astype(np.float32)


def predict_slot(writer: SlotWriter, *, input_path: str) -> int:
    """The work one task does for its range: read, predict, write at the forecasts' valid times, in batches."""
    valid_times = writer.slot_coord  # the valid times of this writer's slot, from the layout
    assert valid_times is not None
    for k in range(0, len(valid_times), BATCH):
        valid = valid_times[k : k + BATCH]
        writer.write("pred", at=valid, data=model(read_windows(input_path, valid)))
    return len(valid_times)


def output_spec() -> LayoutSpec:
    """The output group: one forecast per valid time, sharded along it; valid times and latitudes as coordinates."""
    n = len(VALID_TIMES)  # 94: the last shard is partial
    return LayoutSpec(
        (
            OutputArray(
                "pred",
                (n, LAT, LON),
                (OUT_CHUNK, LAT, LON),
                "float32",
                shards=(OUT_SHARD, LAT, LON),
                dimension_names=("valid_time", "lat", "lon"),
                fill_value=float("nan"),
            ),
        ),
        coords={"valid_time": VALID_TIMES, "lat": np.linspace(-90, 90, LAT)},
    )


def run(workers: int, root: Path, write_behind: int = 2) -> bool:
    """Write the output in parallel and with one writer; True when the two are bit-identical."""
    make_inputs(root / "inputs.zarr")
    input_path = str(root / "inputs.zarr")
    out = LocalStore(root / "outputs.zarr")
    work = functools.partial(predict_slot, input_path=input_path)

    for group in ("parallel", "single"):
        create_layout(out, output_spec(), group=group)  # the coordinator: arrays, valid times, latitudes

    plan = plan_slots(out, group="parallel", workers=workers)
    print(
        f"plan: {len(plan)} ranges of up to {plan.slot_size} valid times (alignment {plan.alignment}): "
        + ", ".join(f"[{r.start}, {r.stop}) = {r.first} .. {r.last}" for r in plan.ranges)
    )
    began = time.perf_counter()
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        report = run_plan(out, plan, work, pool, writer_options={"write_behind": write_behind})
    pids = sorted({o.pid for o in report.outcomes})
    print(f"parallel: {len(report.outcomes)} ranges on {len(pids)} processes in {time.perf_counter() - began:.2f}s")

    began = time.perf_counter()
    run_plan(out, plan_slots(out, group="single", workers=1), work)  # one writer, this process
    print(f"single writer: {time.perf_counter() - began:.2f}s")

    status = write_status(out, "parallel")
    completed = ", ".join(status.describe(a, b) for a, b in status.completed)
    print(f"coverage: {completed}; remaining: {status.remaining}, claims: {len(status.claims)}")
    return _identical(root / "outputs.zarr", "parallel", "single")


def _identical(path: Path, a: str, b: str) -> bool:
    """Every stored object of the arrays is byte-for-byte the same in groups ``a`` and ``b``."""
    same = True
    for name in ("pred", "valid_time", "lat"):
        files_a = {p.relative_to(path / a / name): p.read_bytes() for p in (path / a / name).rglob("*") if p.is_file()}
        files_b = {p.relative_to(path / b / name): p.read_bytes() for p in (path / b / name).rglob("*") if p.is_file()}
        same = same and files_a == files_b
    store = LocalStore(path, read_only=True)
    pred_a = zarr.open_array(store, path=f"{a}/pred", mode="r")[:]
    pred_b = zarr.open_array(store, path=f"{b}/pred", mode="r")[:]
    return same and not np.isnan(pred_a).any() and np.array_equal(pred_a, pred_b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the archives here (default: a temp dir)")
    parser.add_argument(
        "--write-behind", type=int, default=2, help="batches the workers' writers hold in the background (0: none)"
    )
    args = parser.parse_args()
    root = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="insitubatch-write-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        ok = run(args.workers, root, args.write_behind)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print("parallel result is bit-identical to the single-writer result" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
