"""The quick-start demo: write a small ERA5-like zarr locally, then train-iterate it.

Run ``python -m insitubatch.tools.demo`` (or ``./dev demo``). It writes the dataset
once (smooth fields plus noise, so it compresses like real weather, with
consolidated metadata so an HTTP server can serve it), splits it by chunk,
iterates two epochs of ``train`` and one of ``val``, and prints the knobs, the
pool budget, and what each pass did: samples/s, decoded MB/s, store GETs and
pool hits.

The demo gives the pool room for the whole train split (``--budget split``),
so the second epoch is served from memory with no GET. That is a choice, not
the default: ``InSituDataset``'s automatic budget holds only the working set,
and with it (``--budget auto``) the second epoch re-reads most chunks, as
``docs/tuning.md`` explains.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import zarr
from zarr.errors import ZarrUserWarning

from ..dataset import InSituDataset
from ..io.group import open_geometries
from ..plan.splits import split_by_chunk
from ..progress import progress
from ..stores.obstore_stores import obstore_store
from ..testing.data import DEMO_CHUNKS, DEMO_SHAPE, demo, write_era5_like

__all__ = ["DEMO_SHAPE", "main", "write_demo_dataset"]

DEFAULT_PATH = "demo_data/era5_demo.zarr"
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
# The demo's knobs: small batches and blocks suit its small chunks.
DEMO_BATCH_SIZE = 64
DEMO_BLOCK_CHUNKS = 8
DEMO_MAX_INFLIGHT = 16
# "split": room for the whole train split twice over (epoch 2 from memory); "auto": the loader's default.
BUDGET_CHOICES = ("split", "auto")
SPLIT_BUDGET_FACTOR = 2
MB = 1e6


def _consolidated(path: Path) -> bool:
    meta = json.loads((path / "zarr.json").read_text(encoding="utf-8"))
    return meta.get("consolidated_metadata") is not None


def _consolidate(path: Path) -> None:
    with warnings.catch_warnings():
        # zarr warns that v3 consolidated metadata is not in the spec yet; an HTTP server needs it
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(str(path))


def write_demo_dataset(
    path: str | Path, *, shape: tuple[int, int, int] = DEMO_SHAPE, chunks=DEMO_CHUNKS, seed: int = 0
) -> Path:
    """Write the demo group (the :func:`~insitubatch.testing.data.demo` preset) unless one is already there.

    A group already at ``path`` is kept as it is (never replaced: the path
    may be the user's), and one written before its metadata was consolidated
    is consolidated in place.
    """
    path = Path(path)
    spec = demo(shape, chunks, seed)  # checks the chunks before anything is written
    if (path / "zarr.json").exists():
        if not _consolidated(path):
            _consolidate(path)
        return path
    return write_era5_like(path, spec)


def _report(name: str, it: Any, seconds: float, sample_nbytes: int) -> None:
    c = it.counters
    mb = c.samples * sample_nbytes / MB
    print(
        f"{name:<14} {c.batches:>5} batches {c.samples:>6} samples  {c.samples / seconds:>9.0f} samples/s "
        f"{mb / seconds:>8.1f} MB/s   GETs {c.gets:>4}  hits {c.hits:>4}  misses {c.misses:>4}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m insitubatch.tools.demo",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--path", default=DEFAULT_PATH, help="where to write (once) and read the demo zarr")
    parser.add_argument("--batch-size", type=int, default=DEMO_BATCH_SIZE, help="samples per batch")
    parser.add_argument("--block-chunks", type=int, default=DEMO_BLOCK_CHUNKS, help="chunks shuffled together")
    parser.add_argument("--max-inflight", type=int, default=DEMO_MAX_INFLIGHT, help="stored tiles read at once")
    parser.add_argument(
        "--budget",
        choices=BUDGET_CHOICES,
        default="split",
        help="pool budget: 'split' holds the train split (epoch 2 issues no GET), 'auto' is the loader's "
        "default (the working set: epoch 2 re-reads)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    t0 = time.perf_counter()
    path = write_demo_dataset(args.path)
    print(f"dataset        {path}  (ready in {time.perf_counter() - t0:.1f}s)")
    store = obstore_store(path, read_only=True)
    geoms = open_geometries(store)
    print("variables      " + ", ".join(f"{p} {g.shape} stored chunk {g.stored_chunks}" for p, g in geoms.items()))
    manifest = split_by_chunk(geoms["t2m"], fractions=SPLIT_FRACTIONS)
    sample_nbytes = sum(g.sample_nbytes for g in geoms.values())
    split_bytes = sum(g.chunk_nbytes for g in geoms.values()) * len(manifest.chunks("train"))
    budget = SPLIT_BUDGET_FACTOR * split_bytes if args.budget == "split" else None
    with InSituDataset(
        store,
        manifest,
        geoms,
        batch_size=args.batch_size,
        block_chunks=args.block_chunks,
        max_inflight=args.max_inflight,
        cache_budget_bytes=budget,
    ) as ds:
        working = ds.plan("train").working_set_bytes
        print(
            f"knobs          batch_size={ds.batch_size} block_chunks={ds.block_chunks} "
            f"max_inflight={ds.max_inflight} prefetch_depth={ds.prefetch_depth} decode_threads={ds.decode_threads}"
        )
        if budget is None:
            print(
                f"budget         automatic: the working set, {working / MB:.1f} MB — epoch 1 re-reads most "
                "chunks (--budget split keeps the train split in memory)"
            )
        else:
            print(
                f"budget         cache_budget_bytes={budget} ({budget / MB:.1f} MB = {SPLIT_BUDGET_FACTOR} x the "
                f"{split_bytes / MB:.1f} MB train split; the default would be the {working / MB:.1f} MB working "
                "set): epoch 1 is served from memory"
            )
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
