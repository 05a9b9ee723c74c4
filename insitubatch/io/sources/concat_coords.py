"""The 1-D arrays along the concatenated dimension (the time coordinate): read once, served whole.

``concat_stores`` answers these small arrays itself: each member's values
concatenated, padded to the member's span on the virtual axis (NaT for dates,
the fill value for numbers), re-encoded to one CF unit when the members'
units differ or padding puts NaT in them, and written by zarr in memory as
one chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr

from ..._zarr_compat import scratch_store
from ..times import decode_time_coordinate, encode_time_coordinate

__all__ = ["concatenated_coordinate", "materialized", "pad_to"]


def concatenated_coordinate(
    arrays: Sequence[zarr.Array], path: str, names: Sequence[str], spans: Sequence[int]
) -> tuple[np.ndarray, dict, Any]:
    """A coordinate's members' values concatenated, with its attributes and fill value.

    Each member's values are padded to its span on the virtual axis (``spans``):
    dates with NaT (encoded as the int64 NaT pattern, the array's fill value, as
    xarray writes a missing date), numbers with the array's fill value.
    Time is re-encoded to one CF unit when the members' units differ or padding puts NaT in it.
    """
    raws = [np.asarray(a[...]) for a in arrays]
    attrs = dict(arrays[0].attrs)
    fill = arrays[0].metadata.fill_value
    time_keys = ("units", "calendar")
    padded = any(span > len(r) for span, r in zip(spans, raws))
    same_units = all({k: a.attrs.get(k) for k in time_keys} == {k: attrs.get(k) for k in time_keys} for a in arrays)
    if same_units and not padded:
        return np.concatenate(raws), attrs, fill
    dates = [decode_time_coordinate(r, dict(a.attrs), name=path) for r, a in zip(raws, arrays)]
    if any(d is None for d in dates):
        if same_units:  # numbers, not dates: padded with the fill value
            return np.concatenate([pad_to(r, span, fill) for r, span in zip(raws, spans)]), attrs, fill
        raise ValueError(
            f"coordinate {path!r} has different units in the concatenated stores "
            f"({[a.attrs.get('units') for a in arrays]} in {list(names)}) and holds no dates to convert"
        )
    joined = np.concatenate([pad_to(d, span, None) for d, span in zip(dates, spans) if d is not None])
    if joined.dtype.kind != "M":
        if padded:
            raise ValueError(
                f"coordinate {path!r} holds cftime dates: concatenated stores whose lengths are no whole number "
                f"of chunks need datetime64 dates (padding marks the rows no store holds with NaT)"
            )
        values, cf = encode_time_coordinate(joined)
        return values, {**attrs, **cf}, None
    nat = np.isnat(joined)
    values, cf = encode_time_coordinate(joined[~nat])
    out = np.full(joined.shape, np.iinfo(np.int64).min, dtype=np.int64)  # the int64 NaT pattern
    out[~nat] = values
    return out, {**attrs, **cf}, int(np.iinfo(np.int64).min) if nat.any() else None


def pad_to(values: np.ndarray, span: int, fill: Any) -> np.ndarray:
    """``values`` followed by rows of ``fill`` up to ``span`` (NaT for dates, NaN for floats, else ``fill``)."""
    if span <= len(values):
        return values
    if values.dtype.kind == "M":
        blank: Any = np.array("NaT", dtype=values.dtype)[()]
    elif values.dtype.kind == "f":
        blank = np.nan
    elif values.dtype.kind == "O":
        blank = None
    else:
        blank = 0 if fill is None else fill
    return np.concatenate([values, np.full(span - len(values), blank, dtype=values.dtype)])


def materialized(
    first: zarr.Array, dims: tuple[str | None, ...], path: str, values: np.ndarray, attrs: dict, fill: Any
) -> dict[str, bytes]:
    """The keys of a one-chunk array holding ``values`` (written by zarr in memory), under ``path``."""
    mem, written = scratch_store()
    kwargs: dict[str, Any] = {"dimension_names": dims} if first.metadata.zarr_format == 3 else {}
    arr = zarr.create_array(
        store=mem,
        name=path,
        shape=values.shape,
        dtype=values.dtype,
        chunks=values.shape,
        compressors=None,
        filters=None,
        fill_value=fill,
        attributes=attrs,
        zarr_format=first.metadata.zarr_format,
        **kwargs,
    )
    arr[...] = values
    return {k: bytes(v.to_bytes()) for k, v in written.items() if k.startswith(path + "/")}
