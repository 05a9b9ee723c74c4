"""Python face of the compiled kernels: validate with the GIL held, then copy without it.

Every function here checks shapes, dtypes and contiguity and raises
``ValueError`` naming what is wrong; the C code it calls never raises.

Tiles are sample-first: a stored tile of a ``(rows, *inner)`` array is a
C-contiguous ``(n_rows, *tile_inner)`` block whose inner rectangle starts at an
``origin`` in ``inner`` (tiles at the array's far edges are smaller).

- ``gather`` copies runs of tile rows into a ``(batch, *inner)`` buffer — the
  loader's one call per batch and label; ``coalesce_runs`` builds its run table.
- ``assemble_tiles`` / ``fill_region`` build a whole chunk.
- ``select_block`` cuts a selection's piece out of a decoded tile.

The tile-major ``.npy`` files of the disk cache live in ``cache.tilefile``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

import insitubatch._ext.assemble as _assemble
import insitubatch._ext.gather as _gather
import insitubatch._ext.select as _select

from ..reads.pieces import Piece

__all__ = [
    "assemble_tiles",
    "batch_runs",
    "coalesce_runs",
    "fill_region",
    "gather",
    "rect_geometry",
    "select_block",
    "STREAM_MIN_BYTES",
]

_STATUS = _gather.STATUS
# Copies moving at least this many bytes use non-temporal stores: four times the core's
# L2, past which a batch cannot stay cached for its consumer anyway (see _ext/rect.pxd).
STREAM_MIN_BYTES: int = _gather.STREAM_MIN_BYTES


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


# ---------------------------------------------------------------------------
# gather and multi-tile assembly


def _require_writable_rows(name: str, a: np.ndarray) -> None:
    _require_c_contiguous(name, a)
    if not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if a.ndim == 0:
        raise ValueError(f"{name} must have a leading row (sample) axis; got a 0-d array")


def _tile_error(dst_name: str, dst: np.ndarray, i: int, tile: object) -> Exception:
    """The error for the first tile the kernel rejected, re-derived in the kernel's order."""
    if not isinstance(tile, np.ndarray):
        return TypeError(f"tiles[{i}] must be a numpy.ndarray, got {type(tile).__name__}")
    if tile.ndim != dst.ndim:
        return ValueError(
            f"tiles[{i}] has {tile.ndim} dims (shape {tile.shape}) but {dst_name} has {dst.ndim} "
            f"(shape {dst.shape}); a tile is (rows, *tile_inner)"
        )
    if tile.dtype != dst.dtype:
        return ValueError(f"tiles[{i}] has dtype {tile.dtype} but {dst_name} has dtype {dst.dtype}")
    return ValueError(f"tiles[{i}] must be C-contiguous (got strides {tile.strides} for shape {tile.shape})")


def _kernel_error(
    status: int,
    index: int,
    dst_name: str,
    dst: np.ndarray,
    tiles: tuple,
    origins: np.ndarray,
    runs: np.ndarray | None = None,
) -> Exception:
    """Turn a kernel's ``(status, index)`` into the exception that names the problem."""
    if status == _STATUS["NO_MEMORY"]:
        return MemoryError(f"no memory for the tile table of {len(tiles)} tiles")
    if status < _STATUS["TILE_OUTSIDE"]:
        return _tile_error(dst_name, dst, index, tiles[index])
    shapes = np.asarray([t.shape for t in tiles], dtype=np.int64).reshape(len(tiles), dst.ndim)
    if status == _STATUS["TILE_OUTSIDE"]:
        return _explain_rectangle(dst_name, dst, tiles, shapes, origins)
    if status == _STATUS["TILE_ROWS"]:
        return ValueError(
            f"tiles[{index}] has {tiles[index].shape[0]} rows but {dst_name} has {dst.shape[0]}; "
            "a chunk's tiles share its rows"
        )
    assert runs is not None  # the remaining statuses come from gather, which passes its runs
    return _explain_run(runs, shapes[:, 0], dst.shape[0])


def _index_table(name: str, table: object, shape: tuple[int | None, int], dtype: type) -> np.ndarray:
    """``table`` as a C-contiguous integer array of ``shape`` (``None`` = any row count)."""
    a = np.asarray(table)
    if a.size == 0:  # [] or np.empty((0, k)) of any dtype: an empty table
        a = a.astype(dtype)
        if shape[0] is None or shape[0] * shape[1] == 0:
            a = a.reshape(0 if shape[0] is None else shape[0], shape[1])
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != shape[1] or (shape[0] is not None and a.shape[0] != shape[0]):
        want = ("n", shape[1]) if shape[0] is None else shape
        raise ValueError(f"{name} must have shape {want}, got {a.shape}")
    return np.ascontiguousarray(a, dtype=dtype)


def _origin_table(dst_name: str, dst: np.ndarray, tiles: tuple, origins: object) -> np.ndarray:
    """``origins`` as intp ``(len(tiles), dst.ndim - 1)``: one corner per tile in ``dst``'s inner dims, of any rank.

    The rank is the destination's, not the stored array's: a chunk transform
    may drop, add or reorder inner axes, and its one output tile sits at the
    origin of that rank.
    """
    try:
        return _index_table("origins", origins, (len(tiles), dst.ndim - 1), np.intp)
    except ValueError as exc:
        raise ValueError(
            f"{exc}: one corner per tile in {dst_name}'s {dst.ndim - 1} inner dims ({dst_name} shape {dst.shape})"
        ) from None


def _explain_rectangle(
    dst_name: str, dst: np.ndarray, tiles: tuple, shapes: np.ndarray, origins: np.ndarray
) -> Exception:
    """The error naming the first tile whose rectangle leaves ``dst``'s inner extent."""
    inner = np.asarray(dst.shape[1:], dtype=np.int64)
    extent = shapes[:, 1:]
    bad = (origins < 0) | (origins > inner - extent)
    t, k = (int(x) for x in np.argwhere(bad)[0])
    o, e = int(origins[t, k]), int(extent[t, k])
    return ValueError(
        f"tiles[{t}]'s rectangle [{o}:{o + e}) on inner axis {k} does not fit {dst_name}'s "
        f"extent {int(inner[k])} ({dst_name} shape {dst.shape}, origins[{t}]="
        f"{tuple(int(x) for x in origins[t])}, tile shape {tiles[t].shape})"
    )


def _explain_run(runs: np.ndarray, tile_rows: np.ndarray, out_rows: int) -> Exception:
    """The error naming the first run that names no tile or leaves a tile's or ``out``'s rows."""
    tile, src, dst, n = runs.T
    bad = (tile < 0) | (tile >= len(tile_rows))
    if bad.any():
        r = int(np.argmax(bad))
        return ValueError(f"runs[{r}] names tile {int(tile[r])}, but there are {len(tile_rows)} tiles")
    rows = tile_rows[tile]
    bad = (n < 0) | (src < 0) | (src > rows - n) | (dst < 0) | (dst > out_rows - n)
    r = int(np.argmax(bad))
    t, s, d, k = (int(x) for x in runs[r])
    if k < 0:
        return ValueError(f"runs[{r}] has n_rows={k}; it must be >= 0")
    if s < 0 or s + k > int(rows[r]):
        return ValueError(f"runs[{r}] reads rows [{s}:{s + k}) of tiles[{t}], which has {int(rows[r])} rows")
    return ValueError(f"runs[{r}] writes rows [{d}:{d + k}) of out, which has {out_rows} rows")


def coalesce_runs(tile_idx: object, src_rows: object, dst_rows: object) -> np.ndarray:
    """Merge per-row copies into runs ``[tile, src_row, dst_row, n_rows]`` for ``gather``.

    Row ``i`` copies ``tiles[tile_idx[i]][src_rows[i]]`` into ``out[dst_rows[i]]``.
    Rows are ordered by tile then destination, and neighbours whose source and
    destination rows both advance by one become one run (one ``memcpy`` when the
    tile spans the whole inner extent). Vectorized: O(rows log rows) in numpy.

    Returns
    -------
    numpy.ndarray
        int64 ``(n_runs, 4)``, C-contiguous.
    """
    t = np.asarray(tile_idx, dtype=np.int64).reshape(-1)
    s = np.asarray(src_rows, dtype=np.int64).reshape(-1)
    d = np.asarray(dst_rows, dtype=np.int64).reshape(-1)
    if not len(t) == len(s) == len(d):
        raise ValueError(f"tile_idx, src_rows and dst_rows must be equally long, got {len(t)}, {len(s)}, {len(d)}")
    if len(t) == 0:
        return np.empty((0, 4), dtype=np.int64)
    ordered = (t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (d[1:] > d[:-1]))
    if not ordered.all():
        order = np.lexsort((d, t))
        t, s, d = t[order], s[order], d[order]
    starts = np.ones(len(t), dtype=bool)
    starts[1:] = (t[1:] != t[:-1]) | (s[1:] != s[:-1] + 1) | (d[1:] != d[:-1] + 1)
    first = np.flatnonzero(starts)
    lengths = np.diff(first, append=len(t))
    return np.stack([t[first], s[first], d[first], lengths], axis=1)


def batch_runs(samples: np.ndarray, size: int, n_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct chunks a batch's ``samples`` draw from, ascending, and its ``gather`` runs, in one C pass.

    ``samples`` are rows on one array's sample axis, ``size`` rows per chunk,
    ``n_tiles`` tiles per chunk. Run ``[tile, src_row, dst_row, n]`` copies
    rows of tile ``tile % n_tiles`` of chunk ``chunks[tile // n_tiles]`` into
    batch rows ``dst_row...``: list each chunk's tiles in ``chunks`` order for
    ``gather``. Replaces ``np.unique`` + ``coalesce_runs`` (a dozen numpy
    calls per label and batch) with one call.
    """
    s = np.ascontiguousarray(samples, dtype=np.int64).reshape(-1)
    if size < 1 or n_tiles < 1:
        raise ValueError(f"size={size} and n_tiles={n_tiles} must be positive")
    if len(s) and s.min() < 0:
        raise ValueError(f"samples must be non-negative rows, got {int(s.min())}")
    return _gather.batch_runs(s, int(size), int(n_tiles))


def gather(
    out: np.ndarray, tiles: Sequence[np.ndarray], origins: object, runs: object, *, stream: bool | None = None
) -> None:
    """Copy runs of tile rows into their rectangles of the batch buffer ``out``.

    Each run ``[t, src_row, dst_row, n]`` of ``runs`` copies
    ``tiles[t][src_row:src_row + n]`` into
    ``out[dst_row:dst_row + n][rectangle of tile t]``, the rectangle starting at
    ``origins[t]`` in ``out``'s inner dims. Every tile and run is checked in C
    with the GIL held (O(tiles + runs), no per-row Python; numpy only locates
    the culprit for the message once a check failed). The copy then runs
    entirely in C with the GIL released — on several threads when the extension
    was built with OpenMP, and with non-temporal stores when the batch outgrows
    the core's private caches (``STREAM_MIN_BYTES``). Runs must not write
    overlapping rows of the same rectangle, and no tile may overlap ``out`` in
    memory.

    Parameters
    ----------
    out
        C-contiguous, writeable ``(batch, *inner)`` array, any fixed-size dtype.
    tiles
        C-contiguous ``(n_rows_i, *tile_inner_i)`` arrays of ``out``'s dtype.
    origins
        Integers ``(len(tiles), len(inner))``: each tile's corner in ``inner``.
    runs
        Integers ``(n_runs, 4)`` as built by ``coalesce_runs``.
    stream
        Non-temporal stores or not; ``None`` decides on this copy's bytes. A caller filling one batch
        in several copies (one per array) decides on the whole batch: it is read after its last copy.

    Raises
    ------
    ValueError
        Naming the argument, the index and the extent that does not fit.
    """
    _require_writable_rows("out", out)
    tiles = tuple(tiles)
    origins = _origin_table("out", out, tiles, origins)
    runs = _index_table("runs", runs, (None, 4), np.int64)
    stream_min = STREAM_MIN_BYTES if stream is None else (0 if stream else sys.maxsize)
    status, index = _gather.gather_runs(out, tiles, origins, runs, stream_min)
    if status:
        raise _kernel_error(status, index, "out", out, tiles, origins, runs)


def assemble_tiles(dest: np.ndarray, tiles: Sequence[np.ndarray], origins: object) -> None:
    """Copy a chunk's tiles, all rows, into their rectangles of ``dest`` in one GIL-free call.

    ``dest`` is C-contiguous ``(n_rows, *inner)``; ``tiles[i]`` is C-contiguous
    ``(n_rows, *tile_inner_i)`` with ``dest``'s dtype and row count, placed at
    ``origins[i]`` (integers ``(len(tiles), len(inner))``). Tiles are not
    checked for covering ``dest``: fill a missing tile's rectangle with
    ``fill_region(dest, (0, *origin), (n_rows, *tile_inner), value)``.
    """
    _require_writable_rows("dest", dest)
    tiles = tuple(tiles)
    origins = _origin_table("dest", dest, tiles, origins)
    status, index = _assemble.assemble_tiles(dest, tiles, origins, STREAM_MIN_BYTES)
    if status:
        raise _kernel_error(status, index, "dest", dest, tiles, origins)


def select_block(dest: np.ndarray, src: np.ndarray, piece: Piece) -> None:
    """Copy the block ``piece`` selects from every row of the decoded tile ``src`` into ``dest``.

    ``src`` is a C-contiguous ``(rows, *tile_shape)`` tile; ``dest`` a
    C-contiguous, writeable ``(rows, *piece.shape)`` array of its dtype. The
    copy runs in C without the GIL (strided, reversed and listed positions).
    """
    _require_writable_rows("dest", dest)
    _require_c_contiguous("src", src)
    if src.dtype != dest.dtype:
        raise ValueError(f"src dtype {src.dtype} does not match dest dtype {dest.dtype}")
    if dest.shape != (src.shape[0], *piece.shape):
        raise ValueError(f"dest has shape {dest.shape}; the piece needs {(src.shape[0], *piece.shape)}")
    row_bytes = src.strides[0] if src.ndim else 0
    if src.shape[0] and piece.reach > row_bytes:
        raise ValueError(f"the piece reads {piece.reach} bytes into a row of src, whose rows hold {row_bytes}")
    _select.select_rows(dest, src, piece.offsets, piece.starts, piece.extents, piece.fixed, piece.last_run)
