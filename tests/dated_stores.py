"""xarray-written stores with a time axis: the oracle's side of the date tests.

Each store is what a user's archive looks like: ``xarray.Dataset.to_zarr``
with a CF-encoded (or native) time coordinate, an ERA5-like ``(time, lat,
lon)`` field chunked along time, v2 or v3. Tests open the same path with
insitubatch and with ``xarray.open_zarr`` and compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

# A small field per step; the tests are about the time axis.
LAT, LON = 3, 4


def six_hourly(start: str, steps: int) -> np.ndarray:
    """``steps`` 6-hourly ``datetime64[ns]`` dates from ``start``."""
    return np.datetime64(start, "ns") + np.arange(steps) * np.timedelta64(6, "h")


def field(steps: int, seed: int = 0) -> np.ndarray:
    """``(steps, LAT, LON)`` float32 values that differ per step."""
    rng = np.random.default_rng(seed)
    return (np.arange(steps, dtype="f4")[:, None, None] + rng.random((steps, LAT, LON), dtype="f4")).astype("f4")


def write_dated(
    path: Path,
    times: Any,
    *,
    chunk: int = 7,
    zarr_format: int = 3,
    encoding: dict[str, Any] | None = None,
) -> Path:
    """An xarray-written store of ``t2m(time, lat, lon)`` chunked ``chunk`` steps along ``time``."""
    n = len(times)
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), field(n))},
        coords={"time": times, "lat": np.linspace(60.0, -60.0, LAT), "lon": np.arange(LON) * 90.0},
    )
    enc = {"t2m": {"chunks": (chunk, LAT, LON)}}
    if encoding is not None:
        enc["time"] = encoding
    ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=False, encoding=enc)
    return path


def open_xr(path: Path) -> xr.Dataset:
    """The store as xarray decodes it (the oracle)."""
    return xr.open_zarr(path, consolidated=False)
