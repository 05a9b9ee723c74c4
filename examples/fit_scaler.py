"""Fit a StandardScaler over the loader itself, then apply it as a chunk transform.

1. **Fit**: one pass over ``train`` with no transforms, accumulating each
   variable's mean and variance incrementally (Welford's algorithm, merged a
   batch at a time with Chan et al.'s parallel update) — no copy of the
   dataset, memory O(1) per variable, numerically stable in float64.
2. **Save/load** the fitted statistics (``StandardScaler.save`` writes one
   ``.npz``; nothing is pickled).
3. **Apply** the scaler as a chunk transform, scoped to the variables it has
   statistics for: it runs once per chunk on the decode pool and its output
   is what the cache holds. A second pass shows the standardized ``train``
   has mean ≈ 0 and std ≈ 1. ``val`` is printed too: the fit never saw it,
   and with a contiguous (leakage-safe) split it is another season, so its
   statistics drift — which is why stats are fit on train only.

Statistics are per variable (a scalar shaped ``(1, 1)`` to broadcast over a
surface field); pass ``--per-latitude`` for one mean/std per latitude row,
shaped ``(lat, 1)``. Runs on the demo dataset in a temporary directory
(or ``--path``) with no network::

    python examples/fit_scaler.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from insitubatch import InSituDataset, applies, obstore_store, open_geometries, split_by_chunk
from insitubatch.tools.demo import write_demo_dataset
from insitubatch.transforms import StandardScaler

__all__ = ["RunningMoments", "fit", "main"]

# How close the standardized train split must come to mean 0 / std 1 (float32 arithmetic).
TRAIN_TOLERANCE = 1e-3


class RunningMoments:
    """Incremental mean and variance over batches (Welford/Chan), reducing every axis but ``keep``.

    Parameters
    ----------
    keep
        Axes of one sample (batch axis excluded) that keep their own statistics,
        e.g. ``(0,)`` for one per latitude row of a ``(lat, lon)`` field; ``()``
        reduces everything to one scalar per variable.
    """

    def __init__(self, keep: tuple[int, ...] = ()) -> None:
        self.keep = keep
        self.count = 0
        self.mean: np.ndarray | float = 0.0
        self.m2: np.ndarray | float = 0.0  # sum of squared deviations from the mean

    def update(self, batch: np.ndarray) -> None:
        """Fold in a ``(batch, *inner)`` array."""
        keep = {k + 1 for k in self.keep}  # +1: axis 0 of a batch is the batch axis
        axes = tuple(a for a in range(batch.ndim) if a not in keep)
        x = batch.astype(np.float64, copy=False)
        n = int(np.prod([batch.shape[a] for a in axes]))
        mean = x.mean(axis=axes, keepdims=True)
        m2 = np.square(x - mean).sum(axis=axes, keepdims=True)
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + np.square(delta) * (self.count * n / total)
        self.count = total

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)`` shaped to broadcast over one sample's inner axes (population std)."""
        if self.count == 0:
            raise ValueError("no data was seen: update() was never called with a non-empty batch")
        mean = np.asarray(self.mean)[0]  # drop the batch axis
        std = np.sqrt(np.asarray(self.m2)[0] / self.count)
        return mean, std


def fit(ds: InSituDataset, keep: tuple[int, ...]) -> dict[str, RunningMoments]:
    """One pass over ``train``: running moments for every label."""
    moments = {label: RunningMoments(keep) for label in ds.variables}
    for batch in ds.train:
        for label, m in moments.items():
            m.update(batch.arrays[label])
    return moments


def _report(name: str, moments: dict[str, RunningMoments]) -> dict[str, tuple[float, float]]:
    summary = {}
    for label, m in moments.items():
        mean, std = m.stats()
        summary[label] = (float(np.mean(mean)), float(np.mean(std)))
        print(f"  {name:<18} {label:<5} mean {summary[label][0]:>10.4f}   std {summary[label][1]:>8.4f}")
    return summary


def run(path: Path, workdir: Path, batch_size: int, per_latitude: bool) -> None:
    write_demo_dataset(path)  # the demo dataset: a year of 6-hourly steps, a few seconds to write
    store = obstore_store(path, read_only=True)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.8, 0.1, 0.1))
    keep = (0,) if per_latitude else ()

    t0 = time.perf_counter()
    with InSituDataset(store, manifest, geoms, batch_size=batch_size) as ds:
        moments = fit(ds, keep)
    print(f"fit pass over train: {time.perf_counter() - t0:.2f}s")
    _report("raw train", moments)

    # statistics are keyed by array path (what a chunk transform sees), not by label
    mean = {geoms[label].path: m.stats()[0] for label, m in moments.items()}
    std = {geoms[label].path: m.stats()[1] for label, m in moments.items()}
    saved = StandardScaler(mean, std).save(workdir / "scaler.npz")
    scaler = StandardScaler.load(saved)
    print(f"scaler saved to {saved} and loaded back: {scaler}")

    t0 = time.perf_counter()
    with InSituDataset(
        store, manifest, geoms, batch_size=batch_size, chunk_transforms=[applies(list(scaler.paths), scaler)]
    ) as ds:
        train = _report("standardized train", fit(ds, keep))
        val_moments = {label: RunningMoments(keep) for label in ds.variables}
        for batch in ds.val:
            for label, m in val_moments.items():
                m.update(batch.arrays[label])
        _report("standardized val", val_moments)
    print(f"apply passes: {time.perf_counter() - t0:.2f}s")
    worst = max(max(abs(m), abs(s - 1)) for m, s in train.values())
    if worst > TRAIN_TOLERANCE:
        raise SystemExit(f"standardized train is off mean 0 / std 1 by {worst:.2e} (> {TRAIN_TOLERANCE})")
    print(f"standardized train is within {worst:.1e} of mean 0 / std 1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--path", type=Path, default=None, help="where to write/read the demo zarr (default: a temp dir)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--per-latitude", action="store_true", help="one mean/std per latitude row, not per variable")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="insitubatch-fit-scaler-") as tmp:
        path = args.path if args.path is not None else Path(tmp) / "era5_demo.zarr"
        run(path, Path(tmp), args.batch_size, args.per_latitude)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
