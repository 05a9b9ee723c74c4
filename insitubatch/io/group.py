"""Open a zarr group's arrays as geometries, and sort them into data variables, statics and coordinates.

A weather or climate group holds more than the arrays a model samples: the
coordinate arrays labelling each dimension (``time``, ``latitude``...), CF
grid mappings, auxiliary coordinates (2-D ``latitude(y, x)``), and *statics*
(a land-sea mask, orography: fields without the sample axis). ``scan_group``
sorts them; ``open_geometries`` returns the data variables and
``open_statics`` the statics.

Opening lists the group only when it must (no ``variables`` given), and then
through its consolidated metadata when it has some: an HTTP endpoint cannot
list at all, and a bucket lists slowly.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import zarr
import zarr.api.asynchronous as zasync
import zarr.errors

from .._zarr_compat import sync
from ..errors import ForkError, StoreReadError
from ..validation import INT_KNOB_MAX, Anything, Instance, Interval, Table, validate_params
from .arrays import chunk_byte_limit, dimension_names_of, geometry_of
from .coords import CoordinateSource
from .geometry import ArrayGeometry, normalize_axis
from .statics import StaticField, static_of

__all__ = ["GroupContents", "open_geometries", "open_statics", "resolve_statics", "resolve_variables", "scan_group"]

# What zarr raises for a path that holds no array (missing, a group, unreadable metadata).
_NOT_AN_ARRAY = (FileNotFoundError, KeyError, zarr.errors.NodeTypeValidationError)
# Attributes that name other arrays as coordinates (CF, and what xarray writes).
_COORDINATE_ATTRS = ("coordinates", "grid_mapping")
# Attributes only a CF grid mapping carries.
_GRID_MAPPING_ATTRS = ("grid_mapping_name", "crs_wkt", "spatial_ref")


@dataclass(frozen=True)
class GroupContents:
    """What a group holds, sorted: data variables, statics, and what was left out with why.

    ``variables`` have the sample axis (dimension ``sample_dim`` at
    ``sample_axis``); ``statics`` lack it; ``skipped`` maps every other array
    path to the reason it is neither (a coordinate, a grid mapping).
    """

    variables: dict[str, ArrayGeometry]
    statics: dict[str, StaticField]
    skipped: dict[str, str]
    sample_dim: str | None

    def left_out(self) -> dict[str, str]:
        """Every array that is not a data variable, with why (statics included)."""
        why = {path: f"static: it has no {self._axis_words()}" for path in self.statics}
        return {**why, **self.skipped}

    def _axis_words(self) -> str:
        return f"{self.sample_dim!r} axis" if self.sample_dim else "sample axis"


def _store_name(store: Any) -> str:
    return str(store)


def _open_root(zstore: Any, group: str) -> zarr.Group:
    try:
        return zarr.open_group(store=zstore, mode="r", path=group or None)
    except _NOT_AN_ARRAY as exc:
        raise ValueError(f"no zarr group at {group or 'the root'!r} of {_store_name(zstore)}") from exc
    except Exception as exc:  # any backend's failure, named for the user
        raise StoreReadError(
            f"opening the zarr group {group or '/'!r} of {_store_name(zstore)} failed: {type(exc).__name__}: "
            f"{_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _walk_arrays(zstore: Any, root: zarr.Group) -> dict[str, zarr.Array]:
    """Every array below ``root``, by path; lists the store unless the metadata is consolidated."""
    try:
        members = sorted(root.members(max_depth=None), key=lambda kv: kv[0])
    except Exception as exc:  # a store that cannot list (HTTP), or a failing one
        raise StoreReadError(
            f"cannot list the arrays of {_store_name(zstore)}: {type(exc).__name__}: {_first_line(exc)}. "
            "A store that cannot list (an HTTP endpoint) needs consolidated metadata "
            "(zarr.consolidate_metadata on the group) or the arrays named: pass variables=[...]"
        ) from exc
    return {member.path: member for _, member in members if isinstance(member, zarr.Array)}


def _known_arrays(zstore: Any) -> list[str] | None:
    """The store's array paths for an error message, or None where listing is impossible or fails."""
    from ..stores.obstore_stores import lists_keys

    if not lists_keys(zstore):
        return None  # HTTP cannot list: asking would cost seconds of retries to learn nothing
    try:
        root = zarr.open_group(store=zstore, mode="r")
        return sorted(m.path for _, m in root.members(max_depth=None) if isinstance(m, zarr.Array))
    except Exception:
        return None


def _open_arrays(zstore: Any, paths: Sequence[str], what: str, group: str) -> tuple[list[zarr.Array], dict]:
    """The arrays at ``paths``, their metadata read all at once (one round trip on a remote store, not one each).

    Beside them (in the same round trip) ``group``'s metadata: the second
    result is every array its consolidated metadata describes, by path (empty
    without any). The first path (in order) that fails raises, as opening
    them one by one would.
    """

    async def open_all() -> list[Any]:
        opens = (zasync.open_array(store=zstore, path=path, mode="r") for path in paths)
        return await asyncio.gather(_consolidated(zstore, group), *opens, return_exceptions=True)

    consolidated, *opened = sync(open_all())
    for path, result in zip(paths, opened, strict=True):
        if isinstance(result, _NOT_AN_ARRAY):
            listing = _known_arrays(zstore)
            known = f"; arrays are {listing}" if listing is not None else " (the store cannot list its arrays)"
            raise ValueError(f"{what} {path!r} is not an array in the store {_store_name(zstore)}{known}") from result
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result  # KeyboardInterrupt, SystemExit, a cancellation: not the store's doing
            if isinstance(result, ForkError):
                raise result  # not this array's: the process cannot use obstore (its message says why)
            raise StoreReadError(
                f"opening array {path!r} of {_store_name(zstore)} failed: {type(result).__name__}: "
                f"{_first_line(result)}"
            ) from result
    if isinstance(consolidated, BaseException) and not isinstance(consolidated, Exception):
        raise consolidated
    return [zarr.Array(result) for result in opened], consolidated if isinstance(consolidated, dict) else {}


async def _consolidated(zstore: Any, group: str) -> dict[str, zarr.Array]:
    """Every array ``group``'s consolidated metadata describes, by path; empty without any (or any group)."""
    try:
        root = await zasync.open_group(store=zstore, mode="r", path=group or None)
    except Exception:  # no group there, or none readable: the named arrays stand alone
        return {}
    if getattr(root.metadata, "consolidated_metadata", None) is None:
        return {}  # listing would cost round trips (and an HTTP store cannot)
    arrays: dict[str, zarr.Array] = {}
    async for _, member in root.members(max_depth=None):
        if not isinstance(member, zarr.AsyncGroup):
            arrays[member.path] = zarr.Array(member)
    return arrays


def _named_coordinates(arrays: Mapping[str, zarr.Array], root: zarr.Group) -> set[str]:
    """Names other arrays (or the group) declare as coordinates or grid mappings."""
    names: set[str] = set()
    sources = [dict(root.attrs)] + [dict(a.attrs) for a in arrays.values()]
    for attrs in sources:
        for key in _COORDINATE_ATTRS:
            value = attrs.get(key)
            if isinstance(value, str):
                names.update(value.split())
    return names


def _coordinate_reason(path: str, arr: zarr.Array, declared: set[str]) -> str | None:
    """Why ``arr`` is a coordinate (and no data), or None."""
    name = path.rsplit("/", 1)[-1]
    dims = dimension_names_of(arr)
    if arr.ndim == 1 and dims is not None and dims[0] == name:
        return f"coordinate of dimension {name!r}"
    if arr.ndim == 0 and any(k in arr.attrs for k in _GRID_MAPPING_ATTRS):
        return "grid mapping"
    if name in declared:
        return "auxiliary coordinate (named in a 'coordinates' or 'grid_mapping' attribute)"
    return None


def _axis(arr: zarr.Array, sample_axis: int) -> int | None:
    """``sample_axis`` on ``arr`` (negative counts from the end), or None when it has no such axis."""
    axis = sample_axis if sample_axis >= 0 else arr.ndim + sample_axis
    return axis if 0 <= axis < arr.ndim else None


def _sample_dim(candidates: Mapping[str, zarr.Array], sample_axis: int) -> str | None:
    """The dimension name most of the named data has at ``sample_axis`` (weighted by size), or None."""
    named: Counter[str] = Counter()
    for arr in candidates.values():
        axis, dims = _axis(arr, sample_axis), dimension_names_of(arr)
        name = dims[axis] if axis is not None and dims is not None else None
        if name is not None:
            named[name] += arr.size
    return named.most_common(1)[0][0] if named else None


def _sample_axis_of(arr: zarr.Array, sample_axis: int, dim: str | None) -> int | None:
    """Where ``arr`` has the sample dimension (wherever its names put it), else None.

    An array without dimension names has it at ``sample_axis`` when it has that axis.
    """
    dims = dimension_names_of(arr)
    if dims is not None and dim is not None:
        return dims.index(dim) if dim in dims else None
    return _axis(arr, sample_axis)


def scan_group(
    store: Any, *, sample_axis: int = 0, group: str = "", max_chunk_bytes: int | None = None
) -> GroupContents:
    """Sort every array of a group into data variables, statics and coordinates.

    The sample dimension is the one most of the group's (non-coordinate)
    named data has at ``sample_axis``; arrays with it are data variables,
    each sampled along it wherever its dimensions put it, the rest statics
    (an array without dimension names is a data variable sampled along
    ``sample_axis`` when it has that axis). Coordinates (self-named 1-D arrays),
    CF grid mappings and auxiliary coordinates named in a ``coordinates``
    attribute are skipped. Lists the group (through consolidated metadata
    when it has some).

    Raises
    ------
    StoreReadError
        The store failed, or cannot list and has no consolidated metadata.
    """
    from ..stores.obstore_stores import as_store

    limit = chunk_byte_limit(max_chunk_bytes)
    group = _check_group(group)
    zstore = as_store(store)
    root = _open_root(zstore, group)
    arrays = _walk_arrays(zstore, root)
    declared = _named_coordinates(arrays, root)
    skipped: dict[str, str] = {}
    candidates: dict[str, zarr.Array] = {}
    for path, arr in arrays.items():
        reason = _coordinate_reason(path, arr, declared)
        if reason is None:
            candidates[path] = arr
        else:
            skipped[path] = reason
    if not isinstance(sample_axis, int) or isinstance(sample_axis, bool):
        raise TypeError(f"sample_axis must be an int, got {type(sample_axis).__name__} ({sample_axis!r})")
    if candidates and all(_axis(arr, sample_axis) is None for arr in candidates.values()):
        largest = max(candidates, key=lambda p: candidates[p].ndim)
        normalize_axis(sample_axis, candidates[largest].ndim, largest)  # raises, naming that array
    dim = _sample_dim(candidates, sample_axis)
    source = CoordinateSource(zstore, opened=arrays)
    variables: dict[str, ArrayGeometry] = {}
    statics: dict[str, StaticField] = {}
    for path, arr in candidates.items():
        axis = _sample_axis_of(arr, sample_axis, dim)
        if axis is not None:
            variables[path] = geometry_of(arr, sample_axis=axis, max_chunk_bytes=limit, coords=source)
        else:
            statics[path] = static_of(arr, source)
    return GroupContents(variables, statics, skipped, dim)


def _check_group(group: Any) -> str:
    if not isinstance(group, str):
        raise TypeError(
            f"group must be a str (a path inside the store, '' for its root), got {type(group).__name__} ({group!r})"
        )
    return group.strip("/")


def _open_named(
    store: Any, variables: Sequence[str] | Mapping[str, Any], group: str, what: str
) -> list[tuple[str, zarr.Array, CoordinateSource]]:
    """The arrays ``variables`` names (relative to ``group``), opened together without listing the store."""
    from ..stores.obstore_stores import as_store

    if isinstance(variables, str):
        raise TypeError("variables must be a list of array paths, not a single string")
    zstore = as_store(store)
    paths = [f"{group}/{v}".strip("/") if group else str(v) for v in variables]
    arrays, consolidated = _open_arrays(zstore, paths, what, group)
    source = CoordinateSource(zstore, opened=consolidated)
    return [(path, arr, source) for path, arr in zip(paths, arrays, strict=True)]


# What ``open_geometries`` accepts (``validation``); the Anything rows are checked against the store
GEOMETRIES_PARAMETERS: Table = {
    "store": [Anything("as_store: a zarr Store, or a URL/path to open")],
    "sample_axis": [Interval(-INT_KNOB_MAX)],  # negative counts from the end; inside each array's dims: geometry_of
    "variables": [Anything("_open_named: array paths (a list, not one string), against the store's arrays")],
    "group": [Instance(str, "a str (a path inside the store, '' for its root)")],
    "max_chunk_bytes": [Anything("arrays: bytes, or None for INSITUBATCH_MAX_CHUNK_BYTES")],
}
# ``open_statics`` takes the same arguments, without a chunk-size cap
STATICS_PARAMETERS: Table = {name: row for name, row in GEOMETRIES_PARAMETERS.items() if name != "max_chunk_bytes"}


@validate_params(GEOMETRIES_PARAMETERS)
def open_geometries(
    store: Any,
    *,
    sample_axis: int = 0,
    variables: Sequence[str] | Mapping[str, Any] | None = None,
    group: str = "",
    max_chunk_bytes: int | None = None,
) -> dict[str, ArrayGeometry]:
    """Geometries of a group's data variables, keyed by array path.

    Without ``variables``: every array with the sample axis (see
    ``scan_group``); coordinates, grid mappings and statics are left out
    (``scan_group`` says which and why, ``open_statics`` opens statics).
    Naming arrays in ``variables`` opens exactly those, without listing
    the store and without the coordinate test.

    ``max_chunk_bytes`` caps what one decoded chunk of any variable may
    occupy (see ``geometry_of``), so absurd metadata fails here, not in an
    allocation.

    Raises
    ------
    ValueError
        An unknown variable, a 0-D variable, a ``sample_axis`` outside a
        variable's dims, or chunks over ``max_chunk_bytes``, each named; a
        group with no data variable (only coordinates, statics or nothing),
        naming what it holds.
    StoreReadError
        The store failed (naming it and the cause), or cannot list and has
        no consolidated metadata while ``variables`` is not given.
    """

    limit = chunk_byte_limit(max_chunk_bytes)
    group = group.strip("/")
    if variables is None:
        contents = scan_group(store, sample_axis=sample_axis, group=group, max_chunk_bytes=limit)
        if not contents.variables:
            raise ValueError(_no_data_message(store, group, sample_axis, contents))
        return contents.variables
    return {
        path: geometry_of(arr, sample_axis=sample_axis, max_chunk_bytes=limit, coords=source)
        for path, arr, source in _open_named(store, variables, group, "variable")
    }


def _no_data_message(store: Any, group: str, sample_axis: int, contents: GroupContents) -> str:
    found = contents.left_out()
    what = ", ".join(f"{path!r} ({why})" for path, why in sorted(found.items())) if found else "no arrays at all"
    return (
        f"the zarr group {group or '/'!r} of {_store_name(store)} has no data variable along sample_axis="
        f"{sample_axis}; it holds {what}. Name the arrays to read with variables=[...]"
    )


@validate_params(STATICS_PARAMETERS)
def open_statics(
    store: Any, *, variables: Sequence[str] | None = None, sample_axis: int = 0, group: str = ""
) -> dict[str, StaticField]:
    """A group's static fields (arrays without the sample axis: masks, orography), keyed by array path.

    Without ``variables``: every static ``scan_group`` finds (listing the
    group as ``open_geometries`` does). Naming arrays in ``variables`` opens
    exactly those, without listing. Nothing is read here: the dataset reads
    each static's (selected) values once when it opens.

    Raises
    ------
    ValueError
        An unknown array.
    StoreReadError
        The store failed, or cannot list and has no consolidated metadata.
    """

    group = group.strip("/")
    if variables is None:
        return scan_group(store, sample_axis=sample_axis, group=group).statics
    return {path: static_of(arr, source) for path, arr, source in _open_named(store, variables, group, "static")}


def resolve_statics(store: Any, statics: Mapping[str, StaticField] | Sequence[str] | None) -> dict[str, StaticField]:
    """``InSituDataset``'s ``statics`` argument as ``{label: StaticField}`` (a list names array paths)."""
    if statics is None:
        return {}
    if isinstance(statics, Mapping):
        out = {}
        for label, f in statics.items():
            if not isinstance(f, StaticField):
                raise TypeError(f"statics[{label!r}] must be a StaticField (from open_statics), got {type(f).__name__}")
            out[str(label)] = f
        return out
    if isinstance(statics, (list, tuple)):
        return dict(open_statics(store, variables=[str(s) for s in statics]))
    raise TypeError(
        f"statics must be a mapping of label to StaticField, a list of array paths, or None; got {type(statics).__name__}"
    )


def resolve_variables(
    store: Any, variables: Mapping[str, ArrayGeometry] | Sequence[str] | None, n_samples: int
) -> tuple[dict[str, ArrayGeometry], dict[str, str]]:
    """``InSituDataset``'s ``variables`` as ``{label: ArrayGeometry}``, and what ``None`` left out (with why).

    Raises
    ------
    ValueError
        No variable, or one whose sample axis is not ``n_samples`` long (the manifest's).
    """
    left_out: dict[str, str] = {}
    if variables is None:
        contents = scan_group(store)
        left_out = contents.left_out()
        if not contents.variables:
            raise ValueError(
                "the store has no array with a sample axis to draw from; it holds "
                f"{left_out or 'no arrays'}; pass variables= (and statics= for arrays without it)"
            )
        resolved = dict(contents.variables)
    elif isinstance(variables, Mapping):
        resolved = {}
        for label, g in variables.items():
            if not isinstance(g, ArrayGeometry):
                raise TypeError(
                    f"variables[{label!r}] must be an ArrayGeometry (from open_geometries), got {type(g).__name__}"
                )
            resolved[str(label)] = g
    elif isinstance(variables, (list, tuple)):
        resolved = dict(open_geometries(store, variables=list(variables)))
    else:
        raise TypeError(
            f"variables must be a mapping of label to ArrayGeometry, a list of array paths, or None; "
            f"got {type(variables).__name__}"
        )
    if not resolved:
        raise ValueError("variables is empty: name at least one array")
    bad = {lb: g.n_samples for lb, g in resolved.items() if g.n_samples != n_samples}
    if bad:
        raise ValueError(
            f"every variable must have the manifest's {n_samples} samples along its sample axis; these differ: {bad}"
        )
    return resolved, left_out
