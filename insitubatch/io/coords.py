"""The sample axis's coordinate values (by dimension name), read from the store once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.errors

from .geometry import ArrayGeometry

__all__ = ["read_sample_coords"]


def read_sample_coords(store: Any, variables: Mapping[str, ArrayGeometry], n: int) -> dict[str, np.ndarray]:
    """The sample axis's coordinate array (by dimension name) when the store has one, else indices."""
    for g in variables.values():
        dims = g.dimension_names
        name = dims[g.sample_axis] if dims else None
        if not name:
            continue
        parent = g.path.rsplit("/", 1)[0] if "/" in g.path else ""
        for path in ([f"{parent}/{name}"] if parent else []) + [name]:
            try:
                arr = zarr.open_array(store=store, path=path, mode="r")
            except (FileNotFoundError, KeyError, ValueError, TypeError, zarr.errors.NodeTypeValidationError):
                continue
            if arr.ndim == 1 and arr.shape[0] == n:
                return {name: np.asarray(arr[...])}
    return {"sample": np.arange(n)}
