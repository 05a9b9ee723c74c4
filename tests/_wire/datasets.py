"""A zarr group for the wire tests' passes, and a pass through the public API checked against zarr-python's read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from helpers import assert_batch_matches, write_tiled_and_sharded

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import SplitManifest, split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store

GROUP = "w.zarr"
SHAPE = (48, 6, 8)
BATCH_SIZE = 5


def write_group(root: Path) -> dict[str, np.ndarray]:
    """A group under ``root/GROUP``: a 2-tile array and a sharded one, consolidated; their values by path."""
    return write_tiled_and_sharded(root / GROUP, SHAPE, 11)


def manifest_of(url: str, **store: Any) -> SplitManifest:
    """The chunk splits of the group at ``url`` (its metadata read through obstore, the store closed)."""
    opened = obstore_store(url, read_only=True, **store)
    try:
        return split_by_chunk(open_geometries(opened)["v"], fractions=(0.75, 0.25))
    finally:
        close_store(opened)


def check_pass(url: str, data: dict[str, np.ndarray], split: str = "train", **store: Any) -> dict[str, Any]:
    """Open ``url`` with ``obstore_store(**store)``, iterate ``split`` comparing every batch with ``data``.

    Returns the dataset's ``describe()`` (read while it was open).
    """
    opened = obstore_store(url, read_only=True, **store)
    try:
        manifest = split_by_chunk(open_geometries(opened)["v"], fractions=(0.75, 0.25))
        with InSituDataset(opened, manifest, batch_size=BATCH_SIZE, block_chunks=2) as ds:
            batches = 0
            for batch in ds.split(split):
                assert_batch_matches(batch, ds.variables, data)
                batches += 1
            assert batches == len(ds.split(split)) > 0
            return ds.describe()
    finally:
        close_store(opened)
