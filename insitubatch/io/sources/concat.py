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
planner never draws an anchor that reads one. Years stored as one chunk each
of different lengths (xarray's default) share the longest chunk: a shorter
one is lengthened as it is read (:class:`PaddedChunk`). Small coordinate arrays along
the dimension (``time``, which xarray writes as one chunk per store) are read
once and served concatenated (re-encoded to one unit when the members' CF
units differ, or when padding puts NaT in them).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, Store

from ..._zarr_compat import ArrayV3Metadata, sync
from ...stores.obstore_stores import as_store
from ...validation import Anything, Instance, Table, validate_params
from ..time_offsets import UNSTORED_ROWS
from .concat_coords import concatenated_coordinate, materialized
from .padded_chunk import PaddedChunk
from .routed import Route, RoutedStore, close_with, member_keys, slice_bytes

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
    recode: tuple[PaddedChunk | None, ...]  # per member: how its (shorter) chunk becomes a virtual one, if it must

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
    """What ``b`` stores differently from ``a`` (its length along ``axis`` aside), in words, or ``None``.

    An unsharded chunk may be shorter along ``axis`` (its store's one chunk: :class:`PaddedChunk` lengthens it).
    """
    if any(x != y for k, (x, y) in enumerate(zip(a.shape, b.shape)) if k != axis) or a.ndim != b.ndim:
        return f"shape {b.shape}, not {a.shape}"
    da, db = a.metadata.to_dict(), b.metadata.to_dict()
    if a.shards is None and b.shards is None:
        da, db = _chunk_free(da, axis), _chunk_free(db, axis)
    for key in sorted((set(da) | set(db)) - {"shape", "attributes"}):
        if da.get(key) != db.get(key):
            return f"{key} {db.get(key)}, not {da.get(key)}"
    return None


def _chunk_free(doc: dict[str, Any], axis: int) -> dict[str, Any]:
    """A metadata document with its chunk length along ``axis`` blanked (zarr v3's chunk grid, v2's chunks)."""
    doc = dict(doc)
    grid = doc.get("chunk_grid")
    if isinstance(grid, dict):
        conf = dict(grid.get("configuration") or {})
        shape = list(conf.get("chunk_shape") or ())
        shape[axis : axis + 1] = [None] if axis < len(shape) else []
        doc["chunk_grid"] = {**grid, "configuration": {**conf, "chunk_shape": shape}}
    elif doc.get("chunks") is not None:
        chunks = list(doc["chunks"])
        chunks[axis : axis + 1] = [None] if axis < len(chunks) else []
        doc["chunks"] = chunks
    return doc


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

    def recoding(self, key: str) -> PaddedChunk | None:
        """How the bytes routed for ``key`` become the virtual chunk (a shorter member chunk), else ``None``."""
        for v in self.virtual:
            if any(v.recode) and (not v.path or key.startswith(v.path + "/")):
                coords = _decode_key(v.metadata[0], key[len(v.path) + 1 :] if v.path else key)
                if coords is not None and len(coords) == len(v.metadata[0].shape):
                    return v.recode[v.member_key(coords)[0]]
        return None

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        recode = self.recoding(key)
        data = await super().get(key, prototype, None if recode else byte_range)
        if recode is None or data is None:
            return data
        chunk = await recode.convert(data.to_bytes())
        return None if chunk is None else prototype.buffer.from_bytes(slice_bytes(chunk, byte_range))

    def sync_reader(self, resolve: Callable[[Store], Callable[..., Any] | None]) -> Callable[..., Any] | None:
        get = super().sync_reader(resolve)
        if get is None or not any(r for v in self.virtual for r in v.recode):
            return get

        def recoded_get(key: str, *, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Any:
            recode = self.recoding(key)
            data = get(key, prototype=prototype, byte_range=None if recode else byte_range)
            return data if recode is None or data is None else _recoded(recode, data, prototype, byte_range)

        return recoded_get

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


def _recoded(recode: PaddedChunk, data: Any, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Any:
    """A member's chunk ``data`` (a ``Buffer`` or bytes) as the virtual chunk, cut to ``byte_range``."""
    chunk = recode(data.to_bytes() if hasattr(data, "to_bytes") else bytes(data))
    return None if chunk is None else prototype.buffer.from_bytes(slice_bytes(chunk, byte_range))


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
    return int((arr.shards or arr.chunks)[axis])


def _longest_chunk(
    path: str, axis: int, parts: Sequence[zarr.Array], names: Sequence[str], lengths: Sequence[int], dim: str
) -> zarr.Array:
    """The member array whose chunk along ``axis`` is the longest: the virtual array's layout.

    Raises
    ------
    ValueError
        A member stored in another layout, or a member whose shorter chunk is not its one chunk along ``dim``.
    """
    model = max(parts, key=lambda p: _chunk_along(p, axis))
    odd = {n: why for n, p in zip(names, parts) if (why := _layout_difference(model, p, axis)) is not None}
    if odd:
        raise ValueError(
            f"array {path!r} is stored differently in stores {list(odd)} than in {names[parts.index(model)]!r} "
            f"({odd}); concatenated stores must share one layout: write each with the same chunks "
            f"(xarray: encoding={{{path!r}: {{'chunks': (...)}}}})"
        )
    step = _chunk_along(model, axis)
    split = [
        (n, size, _chunk_along(p, axis))
        for n, size, p in zip(names, lengths, parts)
        if _chunk_along(p, axis) < min(size, step)
    ]
    if split:
        raise ValueError(
            f"array {path!r}: stores {split} (name, length along {dim!r}, chunk) hold several chunks shorter than "
            f"the {step}-step chunks of store {names[parts.index(model)]!r}; write every store with the same chunk "
            f"along {dim!r}, or each as one chunk (xarray's default)"
        )
    return model


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
    longest = {path: _longest_chunk(path, axis, parts, names, lengths, dim) for path, (axis, parts) in chunked.items()}
    # every member spans a whole number of every array's chunks on the virtual axis: padded up to their lcm
    unit = math.lcm(*(_chunk_along(longest[path], axis) for path, (axis, _) in chunked.items())) if chunked else 1
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
            values, attrs, fill = concatenated_coordinate(parts, path, names, spans)
            own.update(materialized(arr, _dims(arr), path, values, {**attrs, **marks}, fill))
            continue
        model = longest[path]  # the virtual array is stored as this member's, its chunk the longest
        step = _chunk_along(model, axis)  # the stored chunk (a shard on a sharded array): what one key holds
        first = [s // step for s in starts[:-1]] + [-(-starts[-1] // step)]
        stored = [-(-n // _chunk_along(p, axis)) for n, p in zip(lengths, parts)]
        recode = tuple(
            PaddedChunk(p.metadata, p.chunks, model.metadata, model.chunks, axis) if p.chunks != model.chunks else None
            for p in parts
        )
        member = members[names[parts.index(model)]]
        docs = {
            f"{path}/{d}": sync(member.get(f"{path}/{d}", zarr.core.buffer.default_buffer_prototype()))
            for d in ("zarr.json", ".zarray", ".zattrs")
        }
        own.update(_virtual_doc({k: v.to_bytes() for k, v in docs.items() if v is not None}, shape, marks))
        virtual.append(_Virtual(path, axis, tuple(first), tuple(stored), tuple(p.metadata for p in parts), recode))
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
