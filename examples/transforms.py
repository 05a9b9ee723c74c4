"""Where a transform runs decides what it costs: a chunk transform vs a batch transform.

* **Chunk stage** — ``kelvin_to_celsius`` on ``t2m`` only (scoped with
  ``applies``). It runs on the decode pool once per chunk, before the cache,
  so its result is cached: the second epoch does not call it at all.
* **Batch stage** — wind speed ``sqrt(u10² + v10²)``, a new array in every
  ``Batch``. It needs two variables at once, so it cannot run per chunk; it
  runs in the producer thread for every batch of every epoch, uncached.

The script writes the small ERA5-like demo dataset to a temporary directory
(or ``--path``), runs two epochs, and prints how often each stage ran and
what it cost. No network is used. Run::

    python examples/transforms.py

The same ``kelvin_to_celsius`` can be checked against a real store with
``insitubatch-check-transform URL --var t2m --transform examples/transforms.py:kelvin_to_celsius``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from insitubatch import Batch, InSituDataset, applies, obstore_store, open_geometries, split_by_chunk
from insitubatch.tools.demo import write_demo_dataset
from insitubatch.transforms import kelvin_to_celsius

__all__ = ["Timed", "kelvin_to_celsius", "main", "wind_speed"]

EPOCHS = 2


def wind_speed(batch: Batch) -> Batch:
    """Add ``wind_speed = sqrt(u10² + v10²)`` to the batch (a cross-variable field: batch stage)."""
    u, v = batch.arrays["u10"], batch.arrays["v10"]
    batch.arrays["wind_speed"] = np.sqrt(np.square(u) + np.square(v))
    return batch


class Timed:
    """Wrap a transform and add up its calls and seconds (thread-safe: the decode pool calls it in parallel)."""

    def __init__(self, transform: Callable[[Any], Any]) -> None:
        self.transform = transform
        # keep the wrapped transform's cache identity, so timing it does not change what the cache holds
        self.cache_key = getattr(transform, "cache_key", None)
        self.calls = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def __call__(self, item: Any) -> Any:
        t0 = time.perf_counter()
        out = self.transform(item)
        elapsed = time.perf_counter() - t0
        with self._lock:
            self.calls += 1
            self.seconds += elapsed
        return out

    def take(self) -> tuple[int, float]:
        """Calls and seconds since the last ``take``."""
        with self._lock:
            calls, seconds = self.calls, self.seconds
            self.calls, self.seconds = 0, 0.0
        return calls, seconds


def run(path: Path, batch_size: int) -> None:
    write_demo_dataset(path)  # the demo dataset: a year of 6-hourly steps, a few seconds to write
    store = obstore_store(path, read_only=True)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.8, 0.1, 0.1))
    # a pool that holds the whole train split, so epoch 2 is served from the cache
    budget = sum(g.chunk_nbytes for g in geoms.values()) * len(manifest.chunks("train")) * 2
    chunk_stage = Timed(kelvin_to_celsius)
    batch_stage = Timed(wind_speed)
    with InSituDataset(
        store, manifest, geoms, batch_size=batch_size, cache_budget_bytes=budget,
        chunk_transforms=[applies(["t2m"], chunk_stage)], batch_transforms=[batch_stage],
    ) as ds:  # fmt: skip
        print(f"dataset {path}: {', '.join(f'{p} {g.shape}' for p, g in geoms.items())}")
        print(f"{'':<8} {'wall':>8} {'batches':>8}  {'chunk stage (K->C)':>28}  {'batch stage (wind)':>28}")
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            t0 = time.perf_counter()
            batches, t2m_sum, t2m_n = 0, 0.0, 0
            wind: np.ndarray | None = None
            for batch in ds.train:
                batches += 1
                t2m = batch.arrays["t2m"]
                t2m_sum += float(t2m.sum(dtype=np.float64))
                t2m_n += t2m.size
                wind = batch.arrays["wind_speed"]
            wall = time.perf_counter() - t0
            c_calls, c_s = chunk_stage.take()
            b_calls, b_s = batch_stage.take()
            print(
                f"epoch {epoch}  {wall * 1e3:>6.0f}ms {batches:>8}  {c_calls:>5} calls {c_s * 1e3:>8.1f}ms total"
                f"     {b_calls:>5} calls {b_s * 1e3:>8.1f}ms total"
            )
            added = "none" if wind is None else f"{wind.shape} {wind.dtype} in the last batch"
            print(f"{'':<8} mean t2m {t2m_sum / t2m_n:.2f} °C; wind_speed {added}")
    print(
        "The chunk stage ran once per t2m chunk in epoch 0 and not at all in epoch 1 (its output is cached);\n"
        "the batch stage ran for every batch of every epoch. Push work into the chunk stage when it only\n"
        "needs one variable; keep the batch stage for what needs the assembled batch."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--path", type=Path, default=None, help="where to write/read the demo zarr (default: a temp dir)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    if args.path is not None:
        run(args.path, args.batch_size)
        return 0
    with tempfile.TemporaryDirectory(prefix="insitubatch-transforms-") as tmp:
        run(Path(tmp) / "era5_demo.zarr", args.batch_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
