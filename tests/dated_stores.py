"""The oracle's reader of the dated stores: what xarray decodes from a path the date tests also open.

The stores themselves are written by the one data generator
(:func:`insitubatch.testing.data.write_dated`, with
:func:`~insitubatch.testing.data.six_hourly` dates); tests open the same path
with insitubatch and with :func:`open_xr` and compare.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr


def open_xr(path: Path) -> xr.Dataset:
    """The store as xarray decodes it (the oracle)."""
    return xr.open_zarr(path, consolidated=False)
