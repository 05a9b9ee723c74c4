"""``concat_stores``: stores that each hold a stretch of time (one per year) as one store, concatenated along it.

A :class:`ConcatStore` is a read-only zarr store with the first member's
hierarchy, in which every array along the concatenated dimension is a
*virtual array*: its chunk ``k`` along that dimension is stored chunk
``k - first[j]`` of member ``j``, read with member ``j``'s own client and key.
Chunks never straddle members: a member whose length is no whole number of
chunks (a year of 1460 six-hourly steps in chunks of 8) is *padded* on the
virtual axis up to the next chunk boundary of every array (the least common
multiple of their chunk lengths), with rows no store holds: its last stored
chunk's tail, and absent chunks (read as nothing, never fetched). So the
engine reads, caches and plans the virtual array like any other, one virtual
chunk one stored chunk; a chunk's identity in a cache is the virtual array's
chunk index. The padded rows are marked twice: the concatenated time
coordinate holds NaT there (offsets in time resolve by time across them), and
each virtual array's attribute :data:`UNSTORED_ROWS` lists them, so the
planner never draws an anchor that reads one. Small coordinate arrays along
the dimension (``time``, which xarray writes as one chunk per store) are read
once and served concatenated (re-encoded to one unit when the members' CF
units differ, or when padding puts NaT in them).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.core.chunk_grids import RegularChunkGrid
from zarr.storage import MemoryStore

from ..._zarr_compat import ArrayV3Metadata, sync
from ...validation import Anything, Instance, Table, validate_params
from ..stores import as_store
from ..time_offsets import UNSTORED_ROWS
from ..times import decode_time_coordinate, encode_time_coordinate
from .routed import Route, RoutedStore, close_with, member_keys

__all__ = ["ConcatStore", "concat_stores"]

# Metadata documents of a node (what is not a chunk key).
_DOCS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


@dataclass(frozen=True)
class _Virtual:
    """One array concatenated along ``axis``: the first chunk index each member's chunks start at."""

    path: str
    axis: int
    first: tuple[int, ...]  # per member, plus the total at the end
    stored: tuple[int, ...]  # per member: the chunks it stores along ``axis`` (the rest of its span is padding)
    metadata: tuple[Any, ...]  # per member: zarr's metadata (its chunk key encoding)

    def member_key(self, coords: tuple[int, ...]) -> tuple[int, str | None]:
        """The member holding virtual chunk ``coords``, and its key there (``None``: a chunk of padding)."""
        c = coords[self.axis]
        j = int(np.searchsorted(self.first, c, side="right")) - 1
        local = list(coords)
        local[self.axis] = c - self.first[j]
        if local[self.axis] >= self.stored[j]:
            return j, None
        key = self.metadata[j].encode_chunk_key(tuple(local))
        return j, f"{self.path}/{key}" if self.path else key


def _decode_key(meta: Any, key: str) -> tuple[int, ...] | None:
    """The chunk coordinates a chunk key names in ``meta``'s encoding, or ``None`` for a key that is none."""
    if meta.zarr_format == 3:
        enc = meta.chunk_key_encoding
        name = getattr(enc, "name", "default")
        sep = getattr(enc, "separator", "/")
        if name == "default":
            if key == "c":
                return ()
            if not key.startswith("c" + sep):
                return None
            key = key[2:]
    else:
        sep = meta.dimension_separator or "."
    try:
        return tuple(int(p) for p in key.split(sep))
    except ValueError:
        return None


def _arrays(store: Store) -> dict[str, zarr.Array]:
    """Every array of ``store``'s hierarchy, by path."""
    root = zarr.open_group(store=store, mode="r")
    return {path: node for path, node in root.members(max_depth=None) if isinstance(node, zarr.Array)}


def _dims(arr: zarr.Array) -> tuple[str | None, ...]:
    meta = arr.metadata
    if isinstance(meta, ArrayV3Metadata):
        return tuple(meta.dimension_names or (None,) * arr.ndim)
    named = arr.attrs.get("_ARRAY_DIMENSIONS")
    return tuple(str(d) for d in named) if isinstance(named, list) else (None,) * arr.ndim


def _layout_difference(a: zarr.Array, b: zarr.Array, axis: int) -> str | None:
    """What ``b`` stores differently from ``a`` (its length along ``axis`` aside), in words, or ``None``."""
    if any(x != y for k, (x, y) in enumerate(zip(a.shape, b.shape)) if k != axis) or a.ndim != b.ndim:
        return f"shape {b.shape}, not {a.shape}"
    da, db = a.metadata.to_dict(), b.metadata.to_dict()
    for key in sorted((set(da) | set(db)) - {"shape", "attributes"}):
        if da.get(key) != db.get(key):
            return f"{key} {db.get(key)}, not {da.get(key)}"
    return None


class ConcatStore(RoutedStore):
    """Stores holding consecutive stretches of one dimension as one read-only store. Made by :func:`concat_stores`."""

    def __init__(self, members: Mapping[str, Store], dim: str, own: Mapping[str, bytes], virtual: Sequence[_Virtual]):
        super().__init__(members)
        self.dim = dim
        self.own = dict(own)  # keys this store answers itself: virtual metadata, concatenated coordinates
        self.virtual = sorted(virtual, key=lambda v: -len(v.path))  # the longest path first: no prefix shadows
        self._stores = list(self.members.values())
        self._names = list(self.members)

    def route(self, key: str) -> Route:
        if key in self.own:
            return self.own[key]
        if key.rsplit("/", 1)[-1] == ".zmetadata":
            return None  # consolidated metadata would state the first member's shapes
        for v in self.virtual:
            if v.path and not key.startswith(v.path + "/"):
                continue
            rest = key[len(v.path) + 1 :] if v.path else key
            if rest in _DOCS:
                break
            coords = _decode_key(v.metadata[0], rest)
            if coords is None or len(coords) != len(v.metadata[0].shape):
                break
            j, inner = v.member_key(coords)
            return None if inner is None else (self._names[j], self._stores[j], inner)
        return self._names[0], self._stores[0], key

    def member_of_read(self, path: str, chunk: int) -> str:
        """The member that serves chunk ``chunk`` along ``dim`` of array ``path`` (the first for any other array)."""
        for v in self.virtual:
            if v.path == path:
                return self._names[int(np.searchsorted(v.first, chunk, side="right")) - 1]
        return self._names[0]

    async def _member_keys(self, prefix: str) -> list[str]:
        keys = [k for k in await member_keys(self._stores[0], prefix) if k not in self.own]
        return sorted(set(keys) | {k for k in self.own if k.startswith(prefix)})

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        async for child in self._stores[0].list_dir(prefix):
            yield child


def _encoded_coordinate(
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
            return np.concatenate([_pad(r, span, fill) for r, span in zip(raws, spans)]), attrs, fill
        raise ValueError(
            f"coordinate {path!r} has different units in the concatenated stores "
            f"({[a.attrs.get('units') for a in arrays]} in {list(names)}) and holds no dates to convert"
        )
    joined = np.concatenate([_pad(d, span, None) for d, span in zip(dates, spans) if d is not None])
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


def _pad(values: np.ndarray, span: int, fill: Any) -> np.ndarray:
    """``values`` followed by rows of ``fill`` up to ``span`` (NaT for dates, NaN for floats, else ``fill``)."""
    if span <= len(values):
        return values
    if values.dtype.kind == "M":
        blank: Any = np.datetime64("NaT")
    elif values.dtype.kind == "f":
        blank = np.nan
    elif values.dtype.kind == "O":
        blank = None
    else:
        blank = 0 if fill is None else fill
    return np.concatenate([values, np.full(span - len(values), blank, dtype=values.dtype)])


def _materialized(first: zarr.Array, path: str, values: np.ndarray, attrs: dict, fill: Any) -> dict[str, bytes]:
    """The keys of a one-chunk array holding ``values`` (written by zarr in memory), under ``path``."""
    mem = MemoryStore()
    kwargs: dict[str, Any] = {"dimension_names": _dims(first)} if first.metadata.zarr_format == 3 else {}
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
    return {k: bytes(v.to_bytes()) for k, v in mem._store_dict.items() if k.startswith(path + "/")}


def _virtual_doc(first_docs: dict[str, bytes], shape: tuple[int, ...], marks: dict[str, Any]) -> dict[str, bytes]:
    """The first member's metadata documents of an array with its shape replaced and ``marks`` added to its
    attributes (``zarr.json``'s, or ``.zattrs`` for zarr v2)."""
    out = {}
    for key, raw in first_docs.items():
        doc = json.loads(raw)
        if key.endswith(".zattrs"):
            doc.update(marks)
        else:
            doc["shape"] = list(shape)
            if "attributes" in doc or key.endswith("zarr.json"):
                doc["attributes"] = {**doc.get("attributes", {}), **marks}
        out[key] = json.dumps(doc).encode()
    return out


def _chunk_along(arr: zarr.Array, axis: int) -> int:
    """What one stored key holds along ``axis`` (a shard on a sharded array)."""
    meta = arr.metadata
    grid = meta.chunk_grid if isinstance(meta, ArrayV3Metadata) else None
    return int(grid.chunk_shape[axis] if isinstance(grid, RegularChunkGrid) else meta.chunks[axis])


def _member_lengths(along: Mapping[str, tuple[int, list[zarr.Array]]], names: Sequence[str], dim: str) -> list[int]:
    """Each member's length along ``dim``, the same for each of its arrays along it.

    Raises
    ------
    ValueError
        A member whose arrays along ``dim`` differ in length (naming the store and the arrays).
    """
    lengths = []
    for j, name in enumerate(names):
        found = {path: parts[j].shape[axis] for path, (axis, parts) in along.items()}
        if len(set(found.values())) > 1:
            raise ValueError(f"store {name!r}: its arrays along {dim!r} differ in length ({found})")
        lengths.append(next(iter(found.values()), 0))
    return lengths


def _spans(lengths: Sequence[int], unit: int) -> list[int]:
    """Each member's span on the virtual axis: its length rounded up to ``unit`` (the last: its length)."""
    return [-(-n // unit) * unit for n in lengths[:-1]] + [lengths[-1]]


# What ``concat_stores`` accepts (``validation``); the stores' layouts are checked against one another
CONCAT_PARAMETERS: Table = {
    "stores": [Anything("concat_stores: a list of stores or URLs in order along dim, or {name: store}")],
    "dim": [Instance(str, "a str (the dimension to concatenate along)")],
}


@validate_params(CONCAT_PARAMETERS)
def concat_stores(stores: Sequence[Any] | Mapping[str, Any], *, dim: str = "time") -> ConcatStore:
    """Stores holding consecutive stretches of dimension ``dim`` (one per year) as one store.

    Every array along ``dim`` becomes their concatenation (``xr.concat(..., dim)``);
    the rest (statics, coordinates of other dimensions, attributes) is the
    first store's. Each store keeps its own client and credentials. A store
    whose length is no whole number of chunks (1460 six-hourly steps in
    chunks of 8) is padded to its next chunk boundary with rows no store holds:
    the time coordinate reads NaT there, no pass draws an anchor that reads
    one, and offsets in time (``shift("6h")``) pair across them by time.

    Parameters
    ----------
    stores
        The stores in order along ``dim`` (``[2020, 2021, ...]``), each a zarr
        ``Store`` or a URL/path (opened read-only); or ``{name: store}`` to name them.
    dim
        The dimension to concatenate along.

    Raises
    ------
    ValueError
        Fewer than one store; an array along ``dim`` that a store lacks, or
        stores with another dtype, field shape, chunking or codecs; a store
        whose arrays along ``dim`` differ in length; padding in a coordinate
        of ``cftime`` dates; no array along ``dim``.
    TypeError
        ``stores`` is a single store, URL or path rather than a list of them.
    """
    if isinstance(stores, str | os.PathLike) or not isinstance(stores, Sequence | Mapping):
        raise TypeError(f"stores must be a list of stores (or {{name: store}}), got {type(stores).__name__}")
    named = (
        {str(k): s for k, s in stores.items()}
        if isinstance(stores, Mapping)
        else {f"part{k}": s for k, s in enumerate(stores)}
    )
    if not named:
        raise ValueError("concat_stores needs at least one store")
    members = {name: as_store(s) for name, s in named.items()}
    names, opened = list(members), [_arrays(s) for s in members.values()]
    along: dict[str, tuple[int, list[zarr.Array]]] = {}
    for path, arr in opened[0].items():
        dims = _dims(arr)
        if dim not in dims:
            continue
        lacking = [n for n, arrays in zip(names, opened) if path not in arrays]
        if lacking:
            raise ValueError(f"array {path!r} (along {dim!r}) is in store {names[0]!r} but not in stores {lacking}")
        along[path] = (dims.index(dim), [arrays[path] for arrays in opened])
    lengths = _member_lengths(along, names, dim)
    chunked = {path: axis_parts for path, axis_parts in along.items() if axis_parts[1][0].ndim > 1}
    for path, (axis, parts) in chunked.items():
        odd = {n: why for n, p in zip(names, parts) if (why := _layout_difference(parts[0], p, axis)) is not None}
        if odd:
            raise ValueError(
                f"array {path!r} is stored differently in stores {list(odd)} than in {names[0]!r} ({odd}); "
                f"concatenated stores must share one layout: write each with the same chunks along {dim!r} "
                f"(xarray: encoding={{{path!r}: {{'chunks': (...)}}}})"
            )
    # every member spans a whole number of every array's chunks on the virtual axis: padded up to their lcm
    unit = math.lcm(*(_chunk_along(parts[0], axis) for axis, parts in chunked.values())) if chunked else 1
    spans = _spans(lengths, unit)
    starts = np.cumsum([0] + spans).tolist()
    padding = [[starts[j] + n, starts[j + 1]] for j, n in enumerate(lengths) if spans[j] > n]
    marks = {UNSTORED_ROWS: {"dim": dim, "rows": padding}} if padding else {}
    own: dict[str, bytes] = {}
    virtual: list[_Virtual] = []
    for path, (axis, parts) in along.items():
        arr = parts[0]
        shape = tuple(starts[-1] if k == axis else s for k, s in enumerate(arr.shape))
        if arr.ndim == 1:  # a coordinate: read once and served whole
            values, attrs, fill = _encoded_coordinate(parts, path, names, spans)
            own.update(_materialized(arr, path, values, {**attrs, **marks}, fill))
            continue
        step = _chunk_along(arr, axis)  # the stored chunk (a shard on a sharded array): what one key holds
        first = [s // step for s in starts[:-1]] + [-(-starts[-1] // step)]
        stored = [-(-n // step) for n in lengths]
        docs = {
            f"{path}/{d}": sync(members[names[0]].get(f"{path}/{d}", zarr.core.buffer.default_buffer_prototype()))
            for d in ("zarr.json", ".zarray", ".zattrs")
        }
        own.update(_virtual_doc({k: v.to_bytes() for k, v in docs.items() if v is not None}, shape, marks))
        virtual.append(_Virtual(path, axis, tuple(first), tuple(stored), tuple(p.metadata for p in parts)))
    if not virtual and not own:
        raise ValueError(f"no array of store {names[0]!r} has dimension {dim!r} to concatenate along")
    root = sync(members[names[0]].get("zarr.json", zarr.core.buffer.default_buffer_prototype()))
    if root is not None:  # a consolidated root would state the first store's shapes
        doc = json.loads(root.to_bytes())
        if doc.get("consolidated_metadata") is not None:
            doc["consolidated_metadata"] = None
            own["zarr.json"] = json.dumps(doc).encode()
    concat = ConcatStore(members, dim, own, virtual)
    close_with(concat, named)  # close_store(concat) closes what it opened
    return concat
