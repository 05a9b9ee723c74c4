"""Python face of the compiled kernels: validate with the GIL held, then copy without it.

Every function here checks shapes, dtypes and contiguity and raises
``ValueError`` naming what is wrong; the C code it calls never raises.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._ext import assemble as _assemble

__all__ = ["fill_region", "place_tile", "rect_geometry"]


def _require_c_contiguous(name: str, a: np.ndarray) -> None:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {a.strides} for shape {a.shape})")
    if a.dtype.hasobject:
        raise ValueError(f"{name} has object dtype {a.dtype}; only fixed-size dtypes can be copied")


def _as_bytes(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view over a C-contiguous array (no copy)."""
    return a.reshape(-1).view(np.uint8)


def rect_geometry(
    dst_shape: Sequence[int], rect_shape: Sequence[int], itemsize: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Fold a rectangle of a C-contiguous array into outer extents + one contiguous run.

    Returns ``(outer_extent, dst_byte_strides_of_outer, run_bytes)``. The run
    covers the trailing dims where the rectangle spans the whole destination,
    plus the first dim where it does not.
    """
    ndim = len(dst_shape)
    dst_strides = np.empty(ndim, dtype=np.intp)
    acc = itemsize
    for k in range(ndim - 1, -1, -1):
        dst_strides[k] = acc
        acc *= int(dst_shape[k])
    m = ndim - 1
    while m > 0 and int(rect_shape[m]) == int(dst_shape[m]):
        m -= 1
    run = itemsize
    for k in range(max(m, 0), ndim):
        run *= int(rect_shape[k])
    outer = np.asarray([int(x) for x in rect_shape[: max(m, 0)]], dtype=np.intp)
    return outer, dst_strides[: max(m, 0)].copy(), run


def _check_origin(name: str, origin: Sequence[int], rect: Sequence[int], dst: np.ndarray) -> tuple[int, ...]:
    if len(origin) != dst.ndim or len(rect) != dst.ndim:
        raise ValueError(
            f"{name} has {len(origin)} dims and the rectangle {len(rect)}, "
            f"but the destination has {dst.ndim} dims (shape {dst.shape})"
        )
    out = tuple(int(o) for o in origin)
    for k, (o, r, d) in enumerate(zip(out, rect, dst.shape)):
        if o < 0 or r < 0 or o + r > d:
            raise ValueError(
                f"rectangle [{o}:{o + r}) on axis {k} does not fit the destination's extent {d} "
                f"(destination shape {dst.shape}, {name}={out}, rectangle shape {tuple(rect)})"
            )
    return out


def place_tile(dst: np.ndarray, tile: np.ndarray, origin: Sequence[int]) -> None:
    """Copy ``tile`` into ``dst[origin[0]:origin[0]+tile.shape[0], ...]``.

    Both arrays must be C-contiguous with the same dtype and number of dims.
    Equivalent to the numpy slice assignment, without the GIL during the copy.
    """
    _require_c_contiguous("dst", dst)
    _require_c_contiguous("tile", tile)
    if tile.dtype != dst.dtype:
        raise ValueError(f"tile dtype {tile.dtype} does not match dst dtype {dst.dtype}")
    if not dst.flags.writeable:
        raise ValueError("dst is read-only")
    start = _check_origin("origin", origin, tile.shape, dst)
    if tile.size == 0:
        return
    itemsize = dst.dtype.itemsize
    outer, dst_strides, run = rect_geometry(dst.shape, tile.shape, itemsize)
    src_strides = np.empty(len(outer), dtype=np.intp)
    acc = itemsize
    for k in range(tile.ndim - 1, -1, -1):
        if k < len(outer):
            src_strides[k] = acc
        acc *= tile.shape[k]
    offset = sum(o * s for o, s in zip(start, dst.strides))
    _assemble.copy_rect_bytes(_as_bytes(dst), offset, dst_strides, _as_bytes(tile), 0, src_strides, outer, run)


def fill_region(dst: np.ndarray, origin: Sequence[int], shape: Sequence[int], value: object) -> None:
    """Set ``dst[origin : origin + shape]`` to ``value`` (cast to ``dst.dtype``)."""
    _require_c_contiguous("dst", dst)
    if not dst.flags.writeable:
        raise ValueError("dst is read-only")
    start = _check_origin("origin", origin, shape, dst)
    if any(int(s) == 0 for s in shape):
        return
    pattern = np.asarray(value, dtype=dst.dtype).reshape(1)
    itemsize = dst.dtype.itemsize
    outer, dst_strides, run = rect_geometry(dst.shape, shape, itemsize)
    offset = sum(o * s for o, s in zip(start, dst.strides))
    _assemble.fill_rect_bytes(_as_bytes(dst), offset, dst_strides, outer, run, _as_bytes(pattern))
