"""``concat_stores``: stores that each hold a stretch of time (one per year) as one store, concatenated along it.

A :class:`ConcatStore` is a read-only zarr store with the first member's
hierarchy, in which every array along the concatenated dimension is a
*virtual array*: its shape is the sum of the members', and its chunk ``k``
along that dimension is stored chunk ``k - first[j]`` of member ``j``, read
with member ``j``'s own client and key. Chunks never straddle members (each
member but the last must hold a whole number of chunks along the dimension),
so the engine reads, caches and plans the virtual array like any other; a
chunk's identity in a cache is the virtual array's chunk index, which names
one member's chunk. Small coordinate arrays along the dimension (``time``,
which xarray writes as one chunk per store) are read once and served
concatenated (re-encoded to one unit when the members' CF units differ).
"""

from __future__ import annotations

import json
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
from ...stores.obstore_stores import as_store
from ...validation import Anything, Instance, Table, validate_params
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
    metadata: tuple[Any, ...]  # per member: zarr's metadata (its chunk key encoding)

    def member_key(self, coords: tuple[int, ...]) -> tuple[int, str]:
        """The member holding virtual chunk ``coords``, and its key there."""
        c = coords[self.axis]
        j = int(np.searchsorted(self.first, c, side="right")) - 1
        local = list(coords)
        local[self.axis] = c - self.first[j]
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
            return self._names[j], self._stores[j], inner
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


def _encoded_coordinate(arrays: Sequence[zarr.Array], path: str, names: Sequence[str]) -> tuple[np.ndarray, dict]:
    """A coordinate's members' values concatenated, with its attributes (time re-encoded to one CF unit)."""
    raws = [np.asarray(a[...]) for a in arrays]
    attrs = dict(arrays[0].attrs)
    time_keys = ("units", "calendar")
    if all({k: a.attrs.get(k) for k in time_keys} == {k: attrs.get(k) for k in time_keys} for a in arrays):
        return np.concatenate(raws), attrs
    dates = [decode_time_coordinate(r, dict(a.attrs), name=path) for r, a in zip(raws, arrays)]
    if any(d is None for d in dates):
        raise ValueError(
            f"coordinate {path!r} has different units in the concatenated stores "
            f"({[a.attrs.get('units') for a in arrays]} in {list(names)}) and holds no dates to convert"
        )
    values, cf = encode_time_coordinate(np.concatenate([d for d in dates if d is not None]))
    return values, {**attrs, **cf}


def _materialized(first: zarr.Array, path: str, values: np.ndarray, attrs: dict) -> dict[str, bytes]:
    """The keys of a one-chunk array holding ``values`` (written by zarr in memory), under ``path``."""
    written: dict[str, Any] = {}  # the store's own mapping (zarr's documented ``store_dict``), read back below
    mem = MemoryStore(written)
    kwargs: dict[str, Any] = {"dimension_names": _dims(first)} if first.metadata.zarr_format == 3 else {}
    arr = zarr.create_array(
        store=mem,
        name=path,
        shape=values.shape,
        dtype=values.dtype,
        chunks=values.shape,
        compressors=None,
        filters=None,
        fill_value=first.metadata.fill_value if values.dtype == first.dtype else None,
        attributes=attrs,
        zarr_format=first.metadata.zarr_format,
        **kwargs,
    )
    arr[...] = values
    return {k: bytes(v.to_bytes()) for k, v in written.items() if k.startswith(path + "/")}


def _virtual_doc(first_docs: dict[str, bytes], shape: tuple[int, ...]) -> dict[str, bytes]:
    """The first member's metadata documents of an array with its shape replaced."""
    out = {}
    for key, raw in first_docs.items():
        doc = json.loads(raw)
        doc["shape"] = list(shape)
        out[key] = json.dumps(doc).encode()
    return out


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
    first store's. Each store keeps its own client and credentials.

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
        (not the last) whose length along ``dim`` is not a whole number of
        chunks (a chunk would straddle two stores); no array along ``dim``.
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
    own: dict[str, bytes] = {}
    virtual: list[_Virtual] = []
    for path, arr in opened[0].items():
        dims = _dims(arr)
        if dim not in dims:
            continue
        axis = dims.index(dim)
        lacking = [n for n, arrays in zip(names, opened) if path not in arrays]
        if lacking:
            raise ValueError(f"array {path!r} (along {dim!r}) is in store {names[0]!r} but not in stores {lacking}")
        parts = [arrays[path] for arrays in opened]
        total = sum(p.shape[axis] for p in parts)
        shape = tuple(total if k == axis else s for k, s in enumerate(arr.shape))
        if arr.ndim == 1:  # a coordinate: read once and served whole
            values, attrs = _encoded_coordinate(parts, path, names)
            own.update(_materialized(arr, path, values, attrs))
            continue
        odd = {n: why for n, p in zip(names, parts) if (why := _layout_difference(arr, p, axis)) is not None}
        if odd:
            raise ValueError(
                f"array {path!r} is stored differently in stores {list(odd)} than in {names[0]!r} ({odd}); "
                f"concatenated stores must share one layout: write each with the same chunks along {dim!r} "
                f"that divide its length (xarray: encoding={{{path!r}: {{'chunks': (...)}}}})"
            )
        meta = arr.metadata  # the stored chunk (a shard on a sharded array): what one key holds
        grid = meta.chunk_grid if isinstance(meta, ArrayV3Metadata) else None
        step = int(grid.chunk_shape[axis] if isinstance(grid, RegularChunkGrid) else meta.chunks[axis])
        straddle = [(n, p.shape[axis]) for n, p in zip(names[:-1], parts[:-1]) if p.shape[axis] % step]
        if straddle:
            raise ValueError(
                f"array {path!r}: stores {straddle} (name, length along {dim!r}) do not hold a whole number of "
                f"{step}-step chunks, so a chunk would straddle two stores; rechunk them to a chunk that "
                f"divides each store's length"
            )
        first = np.cumsum([0] + [-(-p.shape[axis] // step) for p in parts]).tolist()
        docs = {
            f"{path}/{d}": sync(members[names[0]].get(f"{path}/{d}", zarr.core.buffer.default_buffer_prototype()))
            for d in ("zarr.json", ".zarray")
        }
        own.update(_virtual_doc({k: v.to_bytes() for k, v in docs.items() if v is not None}, shape))
        virtual.append(_Virtual(path, axis, tuple(first), tuple(p.metadata for p in parts)))
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
