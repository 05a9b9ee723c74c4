"""The quick-start demo: write a small ERA5-like zarr locally, then train-iterate it.

Run ``python -m insitubatch.tools.demo`` (or ``./dev demo``). It writes the dataset
once (smooth fields plus noise, so it compresses like real weather), splits
it by chunk, iterates two epochs of ``train`` and one of ``val``, and prints
what each pass did: samples/s, decoded MB/s, store GETs and pool hits.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import zarr

from ..dataset import InSituDataset
from ..io.group import open_geometries
from ..io.stores import obstore_store
from ..plan.splits import split_by_chunk
from ..progress import progress

__all__ = ["main", "write_demo_dataset"]

DEFAULT_PATH = "demo_data/era5_demo.zarr"
# 6-hourly steps of a coarse 64x32 grid: about 2 years, ~60 MB decoded
DEMO_SHAPE = (2920, 32, 64)
DEMO_CHUNKS = (16, 32, 32)
DEMO_VARIABLES = ("t2m", "u10", "v10")
# The time coordinate: 6-hourly steps from ERA5's first date, CF-encoded (decoded to dates when read).
DEMO_TIME_UNITS = "hours since 1979-01-01 00:00:00"
DEMO_STEP_HOURS = 6


def write_demo_dataset(path: str | Path, *, shape=DEMO_SHAPE, chunks=DEMO_CHUNKS, seed: int = 0) -> Path:
    """Write the demo group (v3, zstd, inner-tiled) with coordinates; skip if it exists."""
    path = Path(path)
    if (path / "zarr.json").exists():
        return path
    rng = np.random.default_rng(seed)
    root = zarr.open_group(path, mode="w")
    n, ny, nx = shape
    t = np.arange(n, dtype="i8")
    time_axis = root.create_array(
        "time",
        shape=(n,),
        chunks=(n,),
        dtype="i8",
        dimension_names=("time",),
        attributes={"units": DEMO_TIME_UNITS, "calendar": "proleptic_gregorian"},  # as xarray writes ERA5's
    )
    time_axis[:] = t * DEMO_STEP_HOURS
    lat = np.linspace(-87.2, 87.2, ny).astype("f4")
    lon = np.linspace(0, 354.4, nx).astype("f4")
    root.create_array("lat", shape=(ny,), chunks=(ny,), dtype="f4", dimension_names=("lat",))[:] = lat
    root.create_array("lon", shape=(nx,), chunks=(nx,), dtype="f4", dimension_names=("lon",))[:] = lon
    phase = 2 * np.pi * t[:, None, None] / 1460.0  # one seasonal cycle per year of 6-hourly steps
    base = np.cos(np.deg2rad(lat))[None, :, None] * np.sin(np.deg2rad(lon) * 3)[None, None, :]
    for k, name in enumerate(DEMO_VARIABLES):
        arr = root.create_array(name, shape=shape, chunks=chunks, dtype="f4", dimension_names=("time", "lat", "lon"))
        for start in range(0, n, chunks[0] * 16):
            stop = min(n, start + chunks[0] * 16)
            field = 280 + 10 * base + 5 * np.sin(phase[start:stop] + k) + rng.standard_normal((stop - start, ny, nx))
            arr[start:stop] = field.astype("f4")
    return path


def _report(name: str, it, seconds: float, sample_nbytes: int) -> None:
    c = it.counters
    mb = c.samples * sample_nbytes / 1e6
    print(
        f"{name:<14} {c.batches:>5} batches {c.samples:>6} samples  {c.samples / seconds:>9.0f} samples/s "
        f"{mb / seconds:>8.1f} MB/s   GETs {c.gets:>4}  hits {c.hits:>4}  misses {c.misses:>4}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH, help="where to write/read the demo zarr")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--block-chunks", type=int, default=8)
    parser.add_argument("--max-inflight", type=int, default=16)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    path = write_demo_dataset(args.path)
    print(f"dataset        {path}  (ready in {time.perf_counter() - t0:.1f}s)")
    store = obstore_store(path, read_only=True)
    geoms = open_geometries(store)
    print("variables      " + ", ".join(f"{p} {g.shape} stored chunk {g.stored_chunks}" for p, g in geoms.items()))
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.8, 0.1, 0.1))
    sample_nbytes = sum(g.sample_nbytes for g in geoms.values())
    # a budget that holds the whole train split turns the pool into a cache for epoch 2
    budget = sum(g.chunk_nbytes for g in geoms.values()) * len(manifest.chunks("train")) * 2
    with InSituDataset(
        store,
        manifest,
        geoms,
        batch_size=args.batch_size,
        block_chunks=args.block_chunks,
        max_inflight=args.max_inflight,
        cache_budget_bytes=budget,
    ) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            t0 = time.perf_counter()
            it = iter(ds.train)
            first = next(it)
            ttfb = time.perf_counter() - t0
            for _ in progress(it, total=len(ds.train) - 1, desc=f"train epoch {epoch}", unit="batch"):
                pass
            _report(f"train epoch {epoch}", it, time.perf_counter() - t0, sample_nbytes)
            print(f"{'':<14} first batch after {ttfb * 1e3:.1f} ms; t2m batch {first.arrays['t2m'].shape}")
        t0 = time.perf_counter()
        it = iter(ds.val)
        for _ in progress(it, total=len(ds.val), desc="val", unit="batch"):
            pass
        _report("val", it, time.perf_counter() - t0, sample_nbytes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
