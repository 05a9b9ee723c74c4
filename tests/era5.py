"""ERA5-shaped stores written by xarray, the oracle for coordinates and selections."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LEVELS = np.array([50, 100, 250, 500, 700, 850, 1000])


def era5_dataset(n_time: int = 24, n_lat: int = 17, n_lon: int = 32, seed: int = 0):
    """time x level x latitude x longitude, descending latitude, 0..360 longitude, a mask and a series."""
    import xarray as xr

    rng = np.random.default_rng(seed)
    time = np.datetime64("2000-01-01T00", "ns") + np.arange(n_time) * np.timedelta64(6, "h")
    lat = np.linspace(90, -90, n_lat)
    lon = np.arange(n_lon) * (360.0 / n_lon)
    shape = (n_time, len(LEVELS), n_lat, n_lon)
    return xr.Dataset(
        {
            "t": (("time", "level", "latitude", "longitude"), rng.standard_normal(shape).astype("f4")),
            "z": (("time", "level", "latitude", "longitude"), rng.standard_normal(shape).astype("f8")),
            "t2m": (("time", "latitude", "longitude"), rng.standard_normal(shape[:1] + shape[2:]).astype("f4")),
            "lsm": (("latitude", "longitude"), (rng.random((n_lat, n_lon)) > 0.6).astype("f4")),
            "orog": (("latitude", "longitude"), rng.random((n_lat, n_lon)).astype("f4") * 3000),
            "gmean": (("time",), rng.standard_normal(n_time).astype("f4")),
        },
        coords={"time": time, "level": LEVELS, "latitude": lat, "longitude": lon},
    )


def write_era5(
    path: Path,
    *,
    zarr_format: int = 3,
    chunks: tuple[int, int, int, int] = (4, 1, 9, 16),
    shards: tuple[int, int, int, int] | None = None,
    consolidated: bool = False,
    **dims: int,
) -> Path:
    """Write ``era5_dataset(**dims)`` with xarray: CF-encoded int64 hours, the given chunks (and v3 shards)."""
    ds = era5_dataset(**dims)
    four = {"chunks": chunks} if shards is None else {"chunks": chunks, "shards": shards}
    three = {"chunks": (chunks[0], *chunks[2:])} if shards is None else {"chunks": (chunks[0], *chunks[2:])}
    encoding = {
        "t": four,
        "z": four,
        "t2m": three,
        "gmean": {"chunks": (chunks[0],)},
        "time": {"units": "hours since 2000-01-01", "dtype": "int64"},
    }
    ds.to_zarr(path, mode="w", zarr_format=zarr_format, encoding=encoding, consolidated=consolidated)
    return path
