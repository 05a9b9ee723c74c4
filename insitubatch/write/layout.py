"""The fixed write layout: every array of an output group, created at full extent up front.

Parallel writers never append. A coordinator calls :func:`create_layout` once,
which creates each array at its final shape along the indexed axis (the
extent never changes during the run), writes the spec's coordinate arrays,
and records in the group's attributes which arrays are indexed, on which
axis, and which coordinate labels that axis. Workers and the planner read
that record back with :func:`read_layout`, recomputing chunk and shard
lengths from the arrays themselves so the alignment they enforce is the
stored truth.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import zarr
import zarr.errors
from zarr.abc.store import Store
from zarr.storage import MemoryStore

from ..errors import LayoutMismatchError, SlotAlignmentError
from ..stores.icechunk_stores import icechunk_session
from .claims import CLAIMS, COVERAGE
from .coords import IndexCoordinate, read_index_coordinate
from .records import RecordStore
from .spec import LayoutSpec, OutputArray

__all__ = ["IndexedArray", "WriteLayout", "create_layout", "diff_layout", "read_layout"]

# Group attribute holding the layout record (which arrays are indexed, the extent).
LAYOUT_ATTRIBUTE = "insitubatch.write"
# Version of the layout record's schema, bumped on incompatible change.
LAYOUT_VERSION = 1
# Record key naming the coordinate array of the index axis (only when the spec has one).
INDEX_COORD = "index_coord"


@dataclass(frozen=True)
class IndexedArray:
    """How one stored array is cut along the indexed dimension."""

    name: str
    axis: int
    shape: tuple[int, ...]
    chunk: int  # zarr chunk length along ``axis`` (inner chunk when sharded)
    shard: int | None  # shard length along ``axis``, ``None`` when not sharded

    @property
    def stored(self) -> int:
        """Length of one stored object (shard, else chunk) along the axis."""
        return self.shard if self.shard is not None else self.chunk


@dataclass(frozen=True)
class WriteLayout:
    """The layout record of a group as stored: extent, indexed arrays, alignment, and the index coordinate if any."""

    group: str
    extent: int
    arrays: tuple[IndexedArray, ...]
    coord: IndexCoordinate | None = field(default=None, compare=False, repr=False)

    @property
    def alignment(self) -> int:
        """LCM of every indexed array's chunk and shard length: the slot granularity."""
        return math.lcm(*(n for a in self.arrays for n in (a.chunk, a.stored)))

    def array(self, name: str) -> IndexedArray:
        """The indexed array ``name``; ``KeyError`` naming the valid ones otherwise."""
        for a in self.arrays:
            if a.name == name:
                return a
        raise KeyError(f"array={name!r} is not an indexed array of this layout; indexed: {self.names}")

    @property
    def names(self) -> list[str]:
        """Indexed array names."""
        return [a.name for a in self.arrays]

    def is_boundary(self, index: int) -> bool:
        """Whether a slot may start or end at ``index`` (aligned, or the array's end)."""
        return index % self.alignment == 0 or index == self.extent

    def aligned_cover(self, start: int, stop: int) -> tuple[int, int]:
        """The smallest aligned range containing ``[start, stop)`` (clipped to the extent)."""
        a = self.alignment
        return max(0, start // a * a), min(self.extent, -(-stop // a) * a)

    def check_range(self, start: int, stop: int) -> None:
        """Validate a slot range ``[start, stop)`` against this layout.

        Raises
        ------
        SlotAlignmentError
            Negative, empty, past the extent, or a boundary off the alignment
            grid (except ``stop`` at the array end); names the nearest aligned
            range containing it.
        """
        if isinstance(start, bool) or isinstance(stop, bool) or int(start) != start or int(stop) != stop:
            raise SlotAlignmentError(f"start={start!r} and stop={stop!r} must be integers")
        if start < 0 or start >= stop:
            raise SlotAlignmentError(f"slot range [{start}, {stop}) must satisfy 0 <= start < stop")
        if stop > self.extent:
            raise SlotAlignmentError(f"slot range [{start}, {stop}) runs past the indexed extent {self.extent}")
        if not (self.is_boundary(start) and self.is_boundary(stop)):
            lo, hi = self.aligned_cover(start, stop)
            detail = ", ".join(
                f"{a.name}: chunk {a.chunk}" + (f", shard {a.shard}" if a.shard is not None else "")
                for a in self.arrays
            )
            raise SlotAlignmentError(
                f"slot range [{start}, {stop}) is not aligned to {self.alignment} (LCM of the indexed "
                f"arrays' chunk and shard lengths: {detail}); two writers would share a stored "
                f"object. Nearest aligned range containing it: [{lo}, {hi})"
            )


def _summary(arr: Any) -> dict[str, Any]:
    """The comparable facts of a stored array, as JSON-like values."""
    meta = json.loads(json.dumps(arr.metadata.to_dict(), default=str))
    codecs = meta.get("codecs")
    if codecs and len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed":
        codecs = codecs[0]["configuration"]["codecs"]  # shard geometry is reported separately
    if meta.get("zarr_format") == 2:
        codecs = {"filters": meta.get("filters"), "compressor": meta.get("compressor")}
    return {
        "zarr_format": meta.get("zarr_format"),
        "shape": tuple(arr.shape),
        "dtype": str(arr.dtype),
        "chunks": tuple(arr.chunks),
        "shards": None if arr.shards is None else tuple(arr.shards),
        "codecs": codecs,
        "fill_value": meta.get("fill_value"),
        "dimension_names": meta.get("dimension_names"),
    }


def _expected_summary(spec: OutputArray) -> dict[str, Any]:
    # Let zarr resolve "auto" codecs and defaults exactly as it will on creation.
    scratch = zarr.open_group(MemoryStore(), mode="w", zarr_format=3)
    try:
        array = scratch.create_array(spec.name, **spec.create_kwargs())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{spec.name}: zarr cannot create this array spec: {exc}") from exc
    return _summary(array)


def _layout_record(spec: LayoutSpec) -> dict[str, Any]:
    record: dict[str, Any] = {"version": LAYOUT_VERSION, "extent": spec.extent, "indexed": spec.indexed}
    if spec.index_coord is not None:  # absent otherwise, so records written before coordinates still match
        record[INDEX_COORD] = spec.index_coord
    return record


def _compare(name: str, stored: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    return [
        f"{name}: {key} is {stored[key]!r} in the store but {expected[key]!r} in the spec"
        for key in expected
        if stored[key] != expected[key]
    ]


def _open_group(store: Store, group: str, mode: Literal["r", "a"]) -> zarr.Group:
    try:
        root = zarr.open_group(store, path=group, mode=mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
        raise LayoutMismatchError(
            f"group={group!r} does not exist in {store!r}; create it with create_layout(store, spec)"
        ) from exc
    if root.metadata.zarr_format != 3:
        raise LayoutMismatchError(
            f"group={group!r} is zarr v{root.metadata.zarr_format}; parallel writes need a zarr v3 "
            "group (claims and coverage are kept as v3 nodes)"
        )
    return root


def _diff(root: zarr.Group, spec: LayoutSpec) -> tuple[list[str], list[OutputArray]]:
    """Differences between ``root`` and ``spec``, and the spec arrays not yet created."""
    lines: list[str] = []
    missing: list[OutputArray] = []
    recorded = root.attrs.get(LAYOUT_ATTRIBUTE)
    stored_values = {c.name: values for c, values in spec.coordinate_arrays()}
    for array_spec in (*spec.arrays, *(c for c, _ in spec.coordinate_arrays())):
        node = root.get(array_spec.name)
        if node is None:
            missing.append(array_spec)
        elif not isinstance(node, zarr.Array):
            lines.append(f"{array_spec.name}: is a group in the store but an array in the spec")
        else:
            lines.extend(_compare(array_spec.name, _summary(node), _expected_summary(array_spec)))
            if recorded is not None and array_spec.name in stored_values:  # filled before the record was written
                lines.extend(_compare_coordinate(node, spec.coords[array_spec.name]))
    expected = _layout_record(spec)
    if recorded is not None and recorded != json.loads(json.dumps(expected)):
        have = recorded if isinstance(recorded, Mapping) else {}  # a record that is no object matches no key
        for key in dict.fromkeys([*expected, INDEX_COORD]):
            if have.get(key) != json.loads(json.dumps(expected.get(key))):
                lines.append(
                    f"layout record: {key} is {have.get(key)!r} in the store but {expected.get(key)!r} in the spec"
                )
    return lines, missing


def _compare_coordinate(node: zarr.Array, values: np.ndarray) -> list[str]:
    """A line when the coordinate stored in ``node`` differs from the spec's ``values``."""
    have = read_index_coordinate(node)
    if have.values.shape == values.shape and bool(np.all(have.values == values)):
        return []
    want = IndexCoordinate(have.name, values)
    return [
        f"{have.name}: coordinate values are {have.describe(0, len(have.values))} in the store but "
        f"{want.describe(0, len(values))} in the spec"
    ]


def diff_layout(store: Store, spec: LayoutSpec, *, group: str = "") -> tuple[str, ...]:
    """Readable differences between the group in ``store`` and ``spec``; empty when they agree.

    Arrays of the spec that do not exist yet are not differences (creating
    them is what :func:`create_layout` does); arrays in the store that the spec
    does not name are ignored.

    Parameters
    ----------
    store
        The zarr store.
    spec
        The wanted layout.
    group
        Path of the output group in the store.

    Returns
    -------
    tuple of str
        One line per differing fact: ``"<array>: <fact> is <stored> in the
        store but <wanted> in the spec"``, facts being zarr_format, shape,
        dtype, chunks, shards, codecs, fill_value and dimension_names.
    """
    try:
        root = zarr.open_group(store, path=group, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        return ()
    return tuple(_diff(root, spec)[0])


def create_layout(store: Store, spec: LayoutSpec, *, group: str = "") -> zarr.Group:
    """Create every array of ``spec`` at its full, fixed extent; a no-op when already there.

    Call this once, from the coordinator, before any worker writes. Nothing
    is written when the group already matches; nothing is created when any
    existing array differs.

    Parameters
    ----------
    store
        A writable zarr store.
    spec
        The layout.
    group
        Path of the output group in the store (created if missing, as zarr v3).

    Returns
    -------
    zarr.Group
        The output group.

    Raises
    ------
    LayoutMismatchError
        The group already holds an array (or a layout record) that differs
        from ``spec``; ``.diff`` holds the lines, the message shows them; or
        the group is zarr v2.
    """
    if not isinstance(spec, LayoutSpec):
        raise TypeError(f"spec must be a LayoutSpec, got {type(spec).__name__}")
    group = group.strip("/")
    root = _open_group(store, group, "a")
    lines, missing = _diff(root, spec)
    if lines:
        raise _mismatch(group, lines)
    for array_spec in missing:
        try:
            root.create_array(array_spec.name, **array_spec.create_kwargs())
        except zarr.errors.ContainsArrayError:
            pass  # another coordinator created it first: compared just below
    if missing:
        lines, _ = _diff(root, spec)
        if lines:
            raise _mismatch(group, lines)
    if root.attrs.get(LAYOUT_ATTRIBUTE) is None:
        _write_coordinates(root, spec)  # before the record: a recorded layout always holds its coordinates
    record = json.loads(json.dumps(_layout_record(spec)))
    if root.attrs.get(LAYOUT_ATTRIBUTE) != record:
        root.update_attributes({LAYOUT_ATTRIBUTE: record})
    if icechunk_session(store) is not None:
        # on icechunk the record groups are part of the layout's commit: every slot's fork would create them
        # otherwise, and icechunk (2.x) refuses to merge forks that created the same group
        for kind in (CLAIMS, COVERAGE):
            RecordStore(store, group, kind).ensure_containers()
    return root


def _write_coordinates(root: zarr.Group, spec: LayoutSpec) -> None:
    """Store each coordinate's values and CF attributes (idempotent: coordinators racing write the same)."""
    for array_spec, values in spec.coordinate_arrays():
        node = root[array_spec.name]
        assert isinstance(node, zarr.Array)  # _diff refused anything else
        if dict(node.attrs) != dict(array_spec.attributes):
            node.update_attributes(dict(array_spec.attributes))
        if not np.array_equal(node[...], values):
            node[...] = values


def _mismatch(group: str, lines: list[str]) -> LayoutMismatchError:
    body = "\n  ".join(lines)
    return LayoutMismatchError(
        f"group={group!r} already holds a layout that differs from the spec "
        f"(the extent and schema are fixed for a parallel run):\n  {body}",
        tuple(lines),
    )


def read_layout(store: Store, group: str = "") -> WriteLayout:
    """Read the write layout of ``group``: its extent and the indexed arrays' chunking.

    Parameters
    ----------
    store
        The zarr store.
    group
        Path of the output group.

    Returns
    -------
    WriteLayout

    Raises
    ------
    LayoutMismatchError
        The group is missing, not zarr v3, has no layout record (it was not
        made by :func:`create_layout`), or an indexed array's extent no longer
        matches the record.
    """
    group = group.strip("/")
    root = _open_group(store, group, "r")
    record = root.attrs.get(LAYOUT_ATTRIBUTE)
    if not isinstance(record, dict) or record.get("version") != LAYOUT_VERSION:
        raise LayoutMismatchError(
            f"group={group!r} has no insitubatch write layout (attribute {LAYOUT_ATTRIBUTE!r}, "
            f"version {LAYOUT_VERSION}); create it with create_layout(store, spec)"
        )
    extent = int(record["extent"])
    arrays = []
    for name, axis in sorted(record["indexed"].items()):
        node = root.get(name)
        if not isinstance(node, zarr.Array):
            raise LayoutMismatchError(f"indexed array {name!r} of group={group!r} is missing from the store")
        if node.shape[axis] != extent:
            raise LayoutMismatchError(
                f"indexed array {name!r} has length {node.shape[axis]} on axis {axis} but the layout's "
                f"extent is {extent}; the extent must stay fixed during a parallel run"
            )
        shard = None if node.shards is None else int(node.shards[axis])
        arrays.append(IndexedArray(name, int(axis), tuple(node.shape), int(node.chunks[axis]), shard))
    coord = None
    if record.get(INDEX_COORD) is not None:
        node = root.get(record[INDEX_COORD])
        if not isinstance(node, zarr.Array) or node.shape != (extent,):
            raise LayoutMismatchError(
                f"the index coordinate {record[INDEX_COORD]!r} of group={group!r} is missing or no longer {extent} long"
            )
        coord = read_index_coordinate(node)
    return WriteLayout(group=group, extent=extent, arrays=tuple(arrays), coord=coord)
