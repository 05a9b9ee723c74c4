"""Random crops: a seeded random window of each sample's field, cut for a whole batch at once.

Patch-based training (super-resolution, local emulators, data
augmentation) takes a random ``h x w`` window of every sample's field
(e.g. 64 x 64 of a 181 x 360 ERA5 grid), a different one per sample and per
epoch. ``RandomCrop`` is a batch transform: it draws every window of a
batch from one generator seeded by ``(seed, epoch, batch index)`` (so a run,
or a resumed one, cuts the same crops) and gathers them all with two numpy
``take_along_axis`` calls, with no Python loop over samples. Each label of
the batch gets the same window, so variables stay aligned as channels.
It declares ``output_rows``, so ``as_torch(view).spec`` and
``to_jax(view).spec`` know the crop shape before the first batch.

    python examples/random_crop.py                          # the demo data (written on first use)
    python examples/random_crop.py --crop 8 8 --epochs 2 --seed 3
    python examples/random_crop.py --url s3://bucket/era5.zarr --variables 2m_temperature --crop 64 64

The loader still reads whole stored tiles: a crop saves the model's work,
not the network's (a fixed window is a selection, see docs/selections.md,
and reads only the tiles it touches). ``--save crops.npz`` keeps the first
batches' sample indices, window origins and crops, to check them against
zarr's own read.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from insitubatch import Batch, InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch.tools.demo import DEFAULT_PATH, write_demo_dataset

__all__ = ["RandomCrop", "main"]

# The demo field is 32 x 64 (latitude x longitude): a quarter of it by default.
DEFAULT_CROP = (16, 32)
SAVED_BATCHES = 3


class RandomCrop:
    """A batch transform: the same random ``(h, w)`` window of the last two axes for every label of a sample.

    Windows are drawn per batch from ``numpy.random.default_rng((seed,
    epoch, batch index))``; their origins ``(row, col)`` are put in
    ``batch.extras["crop_origin"]`` (``(batch, 2)``).
    """

    def __init__(self, size: Sequence[int], seed: int = 0) -> None:
        h, w = (int(s) for s in size)
        if h < 1 or w < 1:
            raise ValueError(f"crop size {(h, w)} must be at least 1 x 1")
        self.size = (h, w)
        self.seed = int(seed)

    def output_rows(self, rows: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> dict:
        """Every label's row with its last two axes cut to the crop: what the adapters' ``spec`` reports."""
        out = {}
        for label, (shape, dtype) in rows.items():
            if len(shape) < 2 or shape[-2] < self.size[0] or shape[-1] < self.size[1]:
                raise ValueError(
                    f"label {label!r} has rows {shape}: a {self.size} crop needs two axes at least as large"
                )
            out[label] = ((*shape[:-2], *self.size), dtype)
        return out

    def origins(self, n: int, field: tuple[int, int], epoch: int, index: int) -> np.ndarray:
        """``(n, 2)`` window origins ``(row, col)`` for batch ``index`` of ``epoch``: the same for the same seed."""
        rng = np.random.default_rng((self.seed, epoch, index))
        high = np.array([field[0] - self.size[0] + 1, field[1] - self.size[1] + 1])
        return rng.integers(0, high, size=(n, 2))

    def __call__(self, batch: Batch) -> Batch:
        h, w = self.size
        fields = {label: tuple(a.shape[1:]) for label, a in batch.arrays.items()}
        field = next(iter(fields.values()))[-2:]
        if any(len(f) < 2 or f[-2:] != field for f in fields.values()) or field[0] < h or field[1] < w:
            raise ValueError(f"a {self.size} crop needs labels whose rows end in one field that large; rows: {fields}")
        n = len(batch)
        origin = self.origins(n, (field[0], field[1]), batch.epoch, batch.index)
        rows = origin[:, :1] + np.arange(h)  # (n, h): the rows each sample keeps
        cols = origin[:, 1:] + np.arange(w)  # (n, w): and its columns
        for label, a in batch.arrays.items():
            lead = (1,) * (a.ndim - 3)  # axes between the batch and the field (a window's steps, levels)
            kept = np.take_along_axis(a, rows.reshape(n, *lead, h, 1), axis=-2)  # (n, ..., h, W)
            batch.arrays[label] = np.take_along_axis(kept, cols.reshape(n, *lead, 1, w), axis=-1)
        batch.extras["crop_origin"] = origin
        return batch


def store_options(url: str) -> dict[str, Any]:
    """Public cloud buckets are read unsigned; other URLs as given."""
    return {"anonymous": True} if url.startswith(("gs://", "gcs://", "s3://")) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a zarr store URL (default: the demo data at --path)")
    parser.add_argument("--path", default=DEFAULT_PATH, help="where the demo data lives (written if missing)")
    parser.add_argument("--variables", nargs="+", default=None, help="arrays to crop (default: every data variable)")
    parser.add_argument("--crop", type=int, nargs=2, default=DEFAULT_CROP, metavar=("H", "W"))
    parser.add_argument("--seed", type=int, default=0, help="seeds the crops and the shuffle")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--save", default=None, help="write the first batches' indices, origins and crops (.npz)")
    args = parser.parse_args(argv)

    url = args.url or str(write_demo_dataset(args.path))
    store = obstore_store(url, read_only=True, **store_options(url))
    geoms = open_geometries(store, variables=args.variables)
    labels = list(geoms)
    manifest = split_by_chunk(geoms[labels[0]], fractions=(0.8, 0.2))
    crop = RandomCrop(args.crop, seed=args.seed)
    saved: dict[str, list[np.ndarray]] = {"epoch": [], "batch": [], "samples": [], "origins": []}
    saved.update({f"crop_{label}": [] for label in labels})
    with InSituDataset(
        store, manifest, geoms, batch_size=args.batch_size, seed=args.seed, batch_transforms=[crop]
    ) as ds:
        field = geoms[labels[0]].row_shape[-2:]
        print(f"{url}: {', '.join(labels)}; fields {field} -> random {tuple(args.crop)} crops, seed {args.seed}")
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            t0, samples = time.perf_counter(), 0
            for batch in ds.train:
                samples += len(batch)
                if batch.index < SAVED_BATCHES:
                    saved["epoch"].append(np.full(len(batch), epoch))
                    saved["batch"].append(np.full(len(batch), batch.index))
                    saved["samples"].append(batch.sample_indices.copy())
                    saved["origins"].append(batch.extras["crop_origin"])
                    for label in labels:
                        saved[f"crop_{label}"].append(batch.arrays[label])
            seconds = time.perf_counter() - t0
            shape = tuple(batch.arrays[labels[0]].shape[1:])
            print(
                f"epoch {epoch}: {samples} crops {shape} per variable in {seconds:.2f}s "
                f"({samples / seconds:.0f} samples/s), {ds.gets} GETs"
            )
    if args.save:
        columns: dict[str, Any] = {k: np.concatenate(v) for k, v in saved.items()}
        np.savez(args.save, **columns)
        print(f"saved the first {SAVED_BATCHES} batches of each epoch to {args.save}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
