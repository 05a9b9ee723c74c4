"""Shuffled batches of WeatherBench2 ERA5 (64×32, 6-hourly), read in place with insitubatch.

By default this reads the public WeatherBench2 archive on Google Cloud
Storage, anonymously; ``--url`` points it at any other zarr store (the
benchmark's emulator, a bucket of your own); ``--local`` writes a
WeatherBench2-sized dataset and serves it from the loopback emulator with a
30 ms time to first byte, so the script runs with no network at all.

    python examples/wb2_dataloader.py                      # gs://weatherbench2/... (anonymous)
    python examples/wb2_dataloader.py --local              # generated data behind the emulator
    python examples/wb2_dataloader.py --url http://127.0.0.1:8123/era5.zarr --max-batches 0

It prints what ``insitubatch inspect`` would (chunk sizes, working set,
read concurrency), then, per epoch: time to first batch, samples/s, MB/s,
GETs and pool hits. Each batch becomes a ``(batch, variable, *grid)``
torch tensor, as a model would take it.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import torch
except ImportError as exc:  # the torch extra
    raise SystemExit("wb2_dataloader.py needs PyTorch: pip install 'insitubatch[torch]'") from exc

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch.tools.inspect_store import inspect_store

WB2_ERA5_URL = "gs://weatherbench2/datasets/era5/1959-2023_01_10-6h-64x32_equiangular_conservative.zarr"
SURFACE_VARIABLES = ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind", "mean_sea_level_pressure"]
# --local: one year of 6-hourly steps, served with a cloud-like time to first byte
LOCAL_STEPS = 1460
LOCAL_LATENCY_MS = 30.0
LOCAL_DIR = Path(tempfile.gettempdir()) / "insitubatch-wb2-local"


@contextlib.contextmanager
def local_wb2(directory: Path, n_time: int, latency_ms: float) -> Iterator[str]:
    """Write the WeatherBench2-sized preset under ``directory`` (once) and serve it; yields its URL."""
    from insitubatch.testing.data import wb2_64x32, write_era5_like
    from insitubatch.testing.served import serve_zarr

    spec = wb2_64x32(n_time)
    with serve_zarr(write_era5_like(directory / spec.name, spec), latency_s=latency_ms / 1e3) as served:
        yield served.url


def store_options(url: str) -> dict[str, bool]:
    """Public cloud buckets are read unsigned; other URLs as given."""
    return {"anonymous": True} if url.startswith(("gs://", "gcs://", "s3://")) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", default=WB2_ERA5_URL, help="zarr store URL (default: WeatherBench2 ERA5 on GCS)")
    where.add_argument("--local", action="store_true", help="generate data and serve it from the local emulator")
    parser.add_argument("--local-dir", type=Path, default=LOCAL_DIR)
    parser.add_argument("--latency-ms", type=float, default=LOCAL_LATENCY_MS, help="--local: time to first byte")
    parser.add_argument("--variables", nargs="+", default=SURFACE_VARIABLES)
    parser.add_argument(
        "--sample-range",
        type=int,
        nargs=2,
        default=None,
        metavar=("START", "STOP"),
        help="time steps to split (default: all)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--block-chunks", type=int, default=16)
    parser.add_argument(
        "--max-inflight", type=lambda v: v if v == "auto" else int(v), default="auto", help='an int, or "auto"'
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-batches", type=int, default=100, help="per epoch; 0 for whole epochs")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(local_wb2(args.local_dir, LOCAL_STEPS, args.latency_ms)) if args.local else args.url
        store = obstore_store(url, read_only=True, **store_options(url))
        t0 = time.perf_counter()
        geoms = open_geometries(store, variables=args.variables)
        first = next(iter(geoms.values()))
        manifest = split_by_chunk(
            first, fractions=(0.8, 0.1, 0.1), sample_range=tuple(args.sample_range) if args.sample_range else None
        )
        print(
            inspect_store(
                url,
                batch_size=args.batch_size,
                block_chunks=args.block_chunks,
                max_inflight=args.max_inflight,
                variables=args.variables,
                storage_options=store_options(url),
            )
        )
        print(f"\nopened in {time.perf_counter() - t0:.2f}s")
        labels = list(geoms)
        sample_mb = sum(g.sample_nbytes for g in geoms.values()) / 1e6
        with InSituDataset(
            store,
            manifest,
            geoms,
            batch_size=args.batch_size,
            block_chunks=args.block_chunks,
            max_inflight=args.max_inflight,
        ) as ds:
            for epoch in range(args.epochs):
                ds.set_epoch(epoch)
                t0 = time.perf_counter()
                ttfb = None
                samples = 0
                it = iter(ds.train)
                for k, batch in enumerate(it):
                    x = torch.from_numpy(batch.stack(labels, axis=1))  # (batch, variable, *grid)
                    if ttfb is None:
                        ttfb = time.perf_counter() - t0
                        shape = tuple(x.shape)
                    samples += x.shape[0]
                    if args.max_batches and k + 1 >= args.max_batches:
                        break
                seconds = time.perf_counter() - t0
                c = it.counters
                it.close()
                print(
                    f"epoch {epoch}: first batch {ttfb:.2f}s {shape}; {samples} samples in {seconds:.2f}s = "
                    f"{samples / seconds:.0f} samples/s, {samples * sample_mb / seconds:.1f} MB/s; "
                    f"GETs {c.gets}, pool hits {c.hits}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
