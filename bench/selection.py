"""Selections over an emulated object store: what two levels and one region cost, against the full read and xarray.

``python -m bench.selection [--latency-ms 30] [--steps 512] [--out DIR]``
writes an ERA5-shaped store (the generator's block-wise levels preset,
:func:`insitubatch.testing.data.era5_13_levels`: time x 13 levels x latitude
x longitude, one level per stored chunk, the globe in 4 x 4 tiles,
descending latitude, 0..360 longitude), serves it from ``EmulatorProcess`` and, in one run, reads
one training epoch of

* the whole field, two of the 13 levels, and a 1/16 region (one tile of the
  4 x 4 grid) with insitubatch, counting GETs and bytes at the server, and
* the same two levels and the same region with xarray over zarr
  (``xr.open_zarr(store)``, then ``.isel(time=batch).sel(...).values`` per
  batch, the batches insitubatch drew), for samples/s.

It prints a table and writes ``selection.json`` to ``--out`` (default
``bench/out``). Ratios are within the run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from insitubatch import InSituDataset, close_store, obstore_store, open_geometries, split_by_chunk
from insitubatch.testing.data import era5_13_levels, write_levels
from insitubatch.testing.emulator import EmulatorProcess

TWO_LEVELS = [850, 500]
REGION = {"latitude": slice(90, 46), "longitude": slice(0, 89)}  # the first tile of the preset's 4 x 4 grid
BATCH = 32
DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def _insitu(url: str, emu: EmulatorProcess, selection: dict[str, Any] | None) -> dict[str, Any]:
    store = obstore_store(url, read_only=True)
    g = open_geometries(store, variables=["t"])["t"]
    view = g if selection is None else g.sel(selection)
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(store, manifest, {"t": view}, batch_size=BATCH) as ds:
        emu.reset_stats()
        t0 = time.perf_counter()
        order = []
        samples = 0
        for batch in ds.train:
            order.append(batch.sample_indices.copy())
            samples += len(batch)
        seconds = time.perf_counter() - t0
        stats = emu.stats()
    close_store(store)
    return {
        "samples": samples,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "gets": stats.gets_where(lambda k: "/t/c/" in k),
        "bytes": sum(v.bytes_sent for k, v in stats.keys.items() if "/t/c/" in k),
        "order": order,
    }


def _xarray(url: str, selection: dict[str, Any], order: list[np.ndarray]) -> dict[str, Any]:
    import xarray as xr

    store = obstore_store(url, read_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(store, consolidated=True)
    t0 = time.perf_counter()
    samples = 0
    for indices in order:
        values = ds["t"].isel(time=indices).sel(selection).values
        samples += len(values)
    seconds = time.perf_counter() - t0
    close_store(store)
    return {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}


def run(steps: int, latency_ms: float, out: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        write_levels(Path(tmp) / "era5.zarr", era5_13_levels(steps))
        with EmulatorProcess(tmp, latency_s=latency_ms / 1e3) as emu:
            url = emu.url_for("era5.zarr")
            cases = {"whole field": None, "2 of 13 levels": {"level": TWO_LEVELS}, "1/16 region": REGION}
            rows: dict[str, Any] = {}
            for name, selection in cases.items():
                rows[name] = _insitu(url, emu, selection)
            for name, selection in cases.items():
                if selection is not None:
                    rows[name]["xarray"] = _xarray(url, selection, rows[name]["order"])
    full = rows["whole field"]
    result: dict[str, Any] = {"steps": steps, "latency_ms": latency_ms, "cases": {}}
    for name, row in rows.items():
        entry = {k: row[k] for k in ("samples", "seconds", "samples_per_s", "gets", "bytes")}
        entry["gets_vs_full"] = row["gets"] / full["gets"]
        entry["bytes_vs_full"] = row["bytes"] / full["bytes"]
        if "xarray" in row:
            entry["xarray_samples_per_s"] = row["xarray"]["samples_per_s"]
            entry["vs_xarray"] = row["samples_per_s"] / row["xarray"]["samples_per_s"]
        result["cases"][name] = entry
    out.mkdir(parents=True, exist_ok=True)
    (out / "selection.json").write_text(json.dumps(result, indent=2))
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"selection over a {result['latency_ms']:g} ms store, {result['steps']} steps, batch {BATCH}",
        f"{'read':<16} {'GETs':>7} {'x full':>7} {'MB':>8} {'x full':>7} {'samples/s':>10} {'xarray/s':>9} {'x xarray':>9}",
    ]
    for name, c in result["cases"].items():
        xa = c.get("xarray_samples_per_s")
        theirs = f"{xa:.0f}" if xa else "-"
        ratio = f"{c['vs_xarray']:.1f}" if xa else "-"
        lines.append(
            f"{name:<16} {c['gets']:>7} {c['gets_vs_full']:>7.3f} {c['bytes'] / 1e6:>8.1f} {c['bytes_vs_full']:>7.3f} "
            f"{c['samples_per_s']:>10.0f} {theirs:>9} {ratio:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512, help="time steps in the store (default: 512)")
    parser.add_argument("--latency-ms", type=float, default=30.0, help="time to first byte (default: 30)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where selection.json goes (default: bench/out)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(table(run(args.steps, args.latency_ms, args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
