"""WeatherBench2 ERA5 through the community stack: xarray + xbatcher + torch DataLoader workers.

``--compare`` measures what the worker model costs at start-up: time to
first batch and samples/s for DataLoader workers under ``spawn``,
``forkserver`` and ``forkserver`` with ``set_forkserver_preload`` (heavy
imports paid once, in the server), next to insitubatch's single event loop
on the same data — each in a fresh interpreter, so every first batch is cold.

    python examples/wb2_xbatcher.py                         # gs://weatherbench2/... (anonymous)
    python examples/wb2_xbatcher.py --local --compare       # generated data behind the 30 ms emulator
    python examples/wb2_xbatcher.py --url http://127.0.0.1:8123/era5.zarr --workers 4

``fork`` is not offered: a forked worker inherits its parent's imports and
state instead of starting cold, which is not the cost this compares, and
obstore's runtime threads do not survive a fork (a child forked after the
parent read through obstore reads local files and HTTP/S3 through
insitubatch's own paths, and refuses anything else with ``ForkError``;
``python -m bench.run`` records what ``fork`` workers do as its fork probe).

Needs PyTorch and the ``bench`` extra (xarray and xbatcher)::

    pip install 'insitubatch[torch,bench]'
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

WB2_ERA5_URL = "gs://weatherbench2/datasets/era5/1959-2023_01_10-6h-64x32_equiangular_conservative.zarr"
SURFACE_VARIABLES = ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind", "mean_sea_level_pressure"]
LOCAL_STEPS = 1460
LOCAL_LATENCY_MS = 30.0
LOCAL_DIR = Path(tempfile.gettempdir()) / "insitubatch-wb2-local"
VARIANTS = ("spawn", "forkserver", "forkserver-preload", "insitubatch")
# what a forkserver preloads so that each forked worker skips these imports
PRELOAD = ["torch", "numpy", "xarray", "xbatcher", "zarr", "obstore"]
RESULT_TAG = "WB2_RESULT "


# what this example needs beyond insitubatch, and the extra that brings each
NEEDS = {"torch": "torch", "xarray": "bench", "xbatcher": "bench"}


def check_extras() -> None:
    """Say which extras to install before anything runs (a --compare child would only fail mid-table)."""
    missing = [module for module in NEEDS if importlib.util.find_spec(module) is None]
    if missing:
        extras = ",".join(sorted({NEEDS[m] for m in missing}))
        raise SystemExit(f"wb2_xbatcher.py needs {', '.join(missing)}: pip install 'insitubatch[{extras}]'")


@contextlib.contextmanager
def local_wb2(directory: Path, n_time: int, latency_ms: float) -> Iterator[str]:
    """Write the WeatherBench2-sized preset under ``directory`` (once) and serve it; yields its URL."""
    from insitubatch.testing.data import wb2_64x32, write_era5_like
    from insitubatch.testing.served import serve_zarr

    spec = wb2_64x32(n_time)
    with serve_zarr(write_era5_like(directory / spec.name, spec), latency_s=latency_ms / 1e3) as served:
        yield served.url


def open_store(url: str) -> Any:
    from insitubatch import obstore_store

    anonymous = url.startswith(("gs://", "gcs://", "s3://"))
    return obstore_store(url, read_only=True, **({"anonymous": True} if anonymous else {}))


class StackVariables:
    """xbatcher transform: one batch Dataset → a ``(batch, variable, *grid)`` tensor."""

    def __init__(self, variables: list[str]) -> None:
        self.variables = variables

    def __call__(self, batch: Any) -> Any:
        import torch

        return torch.from_numpy(np.stack([batch[v].values for v in self.variables], axis=1))


def xbatcher_loader(url: str, variables: list[str], batch_size: int, workers: int, start_method: str) -> Any:
    """The usual stack: open lazily with xarray, cut time batches with xbatcher, load them in workers."""
    import torch
    import xarray as xr
    import xbatcher
    from xbatcher.loaders.torch import MapDataset

    # chunks=None: lazy zarr reads, no dask; xarray's default (dask "auto" chunks)
    # can merge a whole variable into one dask chunk and read all of it per batch
    ds = xr.open_zarr(open_store(url), chunks=None)[variables]
    grid = {d: ds.sizes[d] for d in ds[variables[0]].dims if d != "time"}
    gen = xbatcher.BatchGenerator(ds, input_dims=grid, batch_dims={"time": batch_size}, concat_input_dims=False)
    options = {"multiprocessing_context": start_method} if workers else {}
    return torch.utils.data.DataLoader(
        MapDataset(gen, transform=StackVariables(variables)),
        batch_size=None,
        shuffle=True,
        num_workers=workers,
        **options,
    )


def insitu_batches(url: str, variables: list[str], batch_size: int) -> Any:
    """The same batches' worth of samples from insitubatch (shuffled within chunk blocks)."""
    import torch

    from insitubatch import InSituDataset, open_geometries, split_by_chunk

    store = open_store(url)
    geoms = open_geometries(store, variables=variables)
    manifest = split_by_chunk(next(iter(geoms.values())), fractions={"train": 1.0})
    ds = InSituDataset(store, manifest, geoms, batch_size=batch_size)
    for batch in ds.train:
        yield torch.from_numpy(batch.stack(variables, axis=1))


def measure(batches: Any, max_batches: int, t0: float) -> dict[str, float]:
    """Time to first batch (from ``t0``) and samples/s over the batches after it."""
    ttfb = None
    samples = 0
    t_first = t0
    for k, x in enumerate(batches):
        now = time.perf_counter()
        if ttfb is None:
            ttfb, t_first, shape = now - t0, now, tuple(x.shape)
        else:
            samples += x.shape[0]
        if k + 1 >= max_batches:
            break
    rate = samples / (time.perf_counter() - t_first) if samples else float("nan")
    return {"ttfb_s": ttfb, "samples_per_s": rate, "batch_shape": shape}


def run_variant(variant: str, url: str, variables: list[str], batch_size: int, workers: int, max_batches: int) -> dict:
    """One variant, timed from an empty process state (imports done, nothing opened)."""
    import multiprocessing

    import torch  # noqa: F401 - imported before the clock, as in a training script
    import xarray  # noqa: F401
    import xbatcher  # noqa: F401

    if variant == "forkserver-preload":
        multiprocessing.set_forkserver_preload(PRELOAD)
    t0 = time.perf_counter()
    if variant == "insitubatch":
        batches = insitu_batches(url, variables, batch_size)
    else:
        method = "forkserver" if variant.startswith("forkserver") else variant
        batches = iter(xbatcher_loader(url, variables, batch_size, workers, method))
    result = measure(batches, max_batches, t0)
    del batches
    return {"variant": variant, "workers": 0 if variant == "insitubatch" else workers, **result}


def compare(args: argparse.Namespace, url: str) -> None:
    """Each variant in a fresh interpreter; print one table."""
    rows = []
    for variant in VARIANTS:
        cmd = [
            sys.executable,
            __file__,
            "--url",
            url,
            "--variant",
            variant,
            "--workers",
            str(args.workers),
            "--batch-size",
            str(args.batch_size),
            "--max-batches",
            str(args.max_batches),
            "--variables",
            *args.variables,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:  # the child's own words, not a CalledProcessError
            raise SystemExit(f"the {variant} run failed:\n{proc.stderr.strip() or proc.stdout.strip()}")
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG))
        rows.append(json.loads(line[len(RESULT_TAG) :]))
        print(f"  {variant:<20} done", flush=True)
    base = next(r for r in rows if r["variant"] == "insitubatch")
    print(f"\n{'loader':<42} {'workers':>7} {'first batch s':>13} {'samples/s':>10} {'TTFB / insitubatch':>19}")
    for r in rows:
        name = (
            "insitubatch (one event loop)" if r["variant"] == "insitubatch" else f"xbatcher + DataLoader {r['variant']}"
        )
        print(
            f"{name:<42} {r['workers']:>7} {r['ttfb_s']:>13.2f} {r['samples_per_s']:>10.0f} "
            f"{r['ttfb_s'] / base['ttfb_s']:>18.1f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", default=WB2_ERA5_URL, help="zarr store URL (default: WeatherBench2 ERA5 on GCS)")
    where.add_argument("--local", action="store_true", help="generate data and serve it from the local emulator")
    parser.add_argument("--local-dir", type=Path, default=LOCAL_DIR)
    parser.add_argument("--latency-ms", type=float, default=LOCAL_LATENCY_MS, help="--local: time to first byte")
    parser.add_argument("--variables", nargs="+", default=SURFACE_VARIABLES)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", default="spawn", choices=("spawn", "forkserver"))
    parser.add_argument("--max-batches", type=int, default=20)
    parser.add_argument(
        "--compare", action="store_true", help="TTFB and samples/s across start methods and insitubatch"
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one --compare run
    args = parser.parse_args(argv)
    check_extras()

    if args.variant:
        result = run_variant(args.variant, args.url, args.variables, args.batch_size, args.workers, args.max_batches)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(local_wb2(args.local_dir, LOCAL_STEPS, args.latency_ms)) if args.local else args.url
        if args.compare:
            compare(args, url)
            return 0
        import torch  # noqa: F401

        t0 = time.perf_counter()
        loader = xbatcher_loader(url, args.variables, args.batch_size, args.workers, args.start_method)
        r = measure(iter(loader), args.max_batches, t0)
        print(
            f"xbatcher + DataLoader ({args.workers} {args.start_method} workers): first batch {r['ttfb_s']:.2f}s "
            f"{r['batch_shape']}, then {r['samples_per_s']:.0f} samples/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
