"""Dates on the sample axis: splits by date range, and the anchors a date range covers.

Users name time as dates ("train 1979-2015, validate 2016-2017"); the planner
works in anchor indices. :func:`coordinate_range` turns inclusive bounds into
the half-open index range of the coordinate values inside them, as xarray's
``.sel(time=slice(a, b))`` selects (a string bound names its whole
resolution: ``"2015-12-31"`` runs through that day's last step).
:func:`split_by_time` cuts named date ranges into a ``SplitManifest``:
chunk-granular by default (a chunk straddling a boundary is left out, and
the manifest lists the dates that drops), or at each sample's own date with
``edges="exact"`` (a straddling chunk is then read by both splits).
Quarantined chunks (``exclude_chunks``) are left out of every split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

import numpy as np

from ..io.dates import TimeAxis, format_bound, is_time
from ..io.geometry import ArrayGeometry
from ..validation import Anything, Instance, Options, Table, validate_params
from .anchors import anchor_rules, declare_times, valid_anchor_range
from .quarantine import ChunkRecord, resolve_exclusions
from .splits import DateRun, SplitDates, SplitManifest

__all__ = [
    "EDGES",
    "Edges",
    "anchors_between",
    "coordinate_range",
    "inference_range",
    "sample_coordinate",
    "split_by_time",
]

Edges = Literal["chunk", "exact"]
EDGES: tuple[Edges, ...] = get_args(Edges)
DateBound = Any  # str | datetime | date | np.datetime64 | a cftime date | None (open)


def sample_coordinate(geometries: Iterable[ArrayGeometry]) -> tuple[str, np.ndarray]:
    """The sample axis's dimension name and decoded coordinate, from the first geometry whose store has one.

    Raises
    ------
    ValueError
        No geometry names its sample dimension, or the store holds no
        coordinate array for it.
    """
    tried: list[str] = []
    for g in geometries:
        dims = g.dims
        dim = dims[g.sample_axis] if dims else None
        if not dim:
            tried.append(f"{g.path!r} has no dimension names")
            continue
        found = g.coord_or_none(dim)
        if found is not None:
            return dim, found
        tried.append(f"{g.path!r}: no 1-D array {dim!r} of length {g.n_samples} beside it or in a parent group")
    raise ValueError(
        "dates need the sample axis's coordinate, and none was found (" + "; ".join(tried) + "); "
        "select by index instead (sample_range=(start, stop))"
    )


def _increasing(values: np.ndarray) -> bool:
    return len(values) < 2 or bool(np.all(values[1:] >= values[:-1]))


def _describe_span(axis: TimeAxis | None, values: np.ndarray) -> str:
    if not len(values):
        return "is empty"
    show = axis.format if axis is not None else str
    return f"runs from {show(values[0])} to {show(values[-1])}"


def _bounds(axis: TimeAxis | None, start: DateBound, stop: DateBound, what: str) -> tuple[Any, Any]:
    """The inclusive first and last value ``[start, stop]`` names (``None`` open)."""
    if axis is None:
        for name, v in (("start", start), ("stop", stop)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float | np.number)):
                raise TypeError(f"{what}: {name}={v!r} must be a number: the coordinate holds numbers, not dates")
        return start, stop
    try:
        lo = None if start is None else axis.bounds(start)[0]
        hi = None if stop is None else axis.bounds(stop)[1]
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what}: {exc}") from exc
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{what}: start={format_bound(start)!r} is after stop={format_bound(stop)!r}")
    return lo, hi


def coordinate_range(
    values: np.ndarray, start: DateBound = None, stop: DateBound = None, *, what: str = "range"
) -> tuple[int, int]:
    """The indices ``[lo, hi)`` of the ``values`` inside ``[start, stop]`` (both inclusive; ``None`` is open).

    Dates for a time coordinate (a string names its whole resolution, as in
    xarray's ``.sel(time=slice(start, stop))``), numbers for a numeric one.
    The range may be empty (``lo == hi``).

    Raises
    ------
    ValueError
        ``values`` do not increase, a bound is not a date of the
        coordinate's calendar, or ``start`` is after ``stop``.
    TypeError
        A bound of the wrong kind (a number for dates, a date for numbers).
    """
    axis = TimeAxis.of(values) if is_time(values) else None
    comparable = axis.values(values) if axis is not None else values
    if not _increasing(comparable):
        raise ValueError(f"{what}: the coordinate does not increase, so a range of it is no run of indices")
    lo_value, hi_value = _bounds(axis, start, stop, what)
    lo = 0 if lo_value is None else int(np.searchsorted(comparable, lo_value, side="left"))
    hi = len(values) if hi_value is None else int(np.searchsorted(comparable, hi_value, side="right"))
    return lo, max(lo, hi)


def anchors_between(geometries: Iterable[ArrayGeometry], start: DateBound, stop: DateBound) -> tuple[int, int]:
    """The anchors ``[lo, hi)`` whose sample-axis coordinate lies in ``[start, stop]`` (both inclusive).

    Raises
    ------
    ValueError
        No coordinate, no anchor in the range, or bounds that are not dates of
        the coordinate (see :func:`coordinate_range`).
    """
    dim, values = sample_coordinate(geometries)
    what = f"start={format_bound(start)!r}, stop={format_bound(stop)!r}"
    lo, hi = coordinate_range(values, start, stop, what=what)
    if lo >= hi:
        axis = TimeAxis.of(values) if is_time(values) else None
        raise ValueError(f"{what} selects no sample: coordinate {dim!r} {_describe_span(axis, values)}")
    return lo, hi


def inference_range(
    manifest: SplitManifest,
    outputs: Mapping[str, ArrayGeometry],
    geometries: Iterable[ArrayGeometry],
    sample_range: tuple[int, int] | None,
    start: DateBound,
    stop: DateBound,
) -> tuple[int, int]:
    """The anchors ``[lo, hi)`` an inference pass covers, checked against every label's window.

    ``sample_range`` gives them as indices, ``start``/``stop`` as inclusive
    coordinate values (:func:`anchors_between` over ``geometries``, the
    labels' views before chunk transforms); with neither, every anchor whose
    window (``anchor + offset`` for each label of ``outputs``) fits its array.
    Either way no anchor may want a time the archive lacks (``anchors``).

    Raises
    ------
    ValueError
        Both forms given; an empty range or one outside the arrays; a label's
        window off its array (the message names the label and the valid range).
    TimeAxisError
        An anchor of the range wants a time the archive does not store, or
        one the manifest declares missing (the message names the times).
    """
    geometries = list(geometries)  # the labels' views before chunk transforms: their time axis, their offsets
    rules = anchor_rules(manifest, {str(k): g for k, g in enumerate(geometries)})
    if start is not None or stop is not None:
        if sample_range is not None:
            raise ValueError("give sample_range=(start, stop) indices or start=/stop= coordinates, not both")
        sample_range = anchors_between(geometries, start, stop)
    lo, hi = valid_anchor_range(manifest, outputs)
    n = manifest.n_samples
    if sample_range is None:
        if lo >= hi:
            raise ValueError(f"no anchor has every window inside the arrays (valid range would be [{lo}, {hi}))")
        rules.check_inference(lo, hi)
        return lo, hi
    try:
        first, end = (int(v) for v in sample_range)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sample_range={sample_range!r} must be a (start, stop) pair of ints") from exc
    if not 0 <= first < end <= n:
        raise ValueError(f"sample_range={(first, end)} must satisfy 0 <= start < stop <= {n}")
    for label, g in outputs.items():
        if g.time_rows is not None:  # offsets in time: no fixed reach; the times they want are checked below
            continue
        low, high = min(g.read_offsets), max(g.read_offsets)
        if first + low < 0 or end - 1 + high >= n:
            raise ValueError(
                f"label {label!r} reads anchor + {list(g.read_offsets) if g.window_steps else g.offset}, so "
                f"sample_range={(first, end)} would read [{first + low}, {end + high}) off its array of "
                f"{n} samples; anchors with every window inside the arrays are [{lo}, {hi})"
            )
    rules.check_inference(first, end)
    return first, end


def _named_ranges(ranges: Mapping[str, tuple[DateBound, DateBound]]) -> list[tuple[str, DateBound, DateBound]]:
    if not isinstance(ranges, Mapping) or not ranges:
        raise TypeError(
            "ranges must be a non-empty mapping of split name to (start, stop) dates, e.g. "
            "{'train': ('1979-01-01', '2015-12-31'), 'val': ('2016-01-01', None)}"
        )
    out = []
    for name, bounds in ranges.items():
        if isinstance(bounds, str) or not isinstance(bounds, tuple | list) or len(bounds) != 2:
            raise TypeError(f"ranges[{name!r}]={bounds!r} must be a (start, stop) pair (None for an open end)")
        out.append((str(name), bounds[0], bounds[1]))
    return out


def _check_disjoint(spans: list[tuple[str, Any, Any, str]]) -> None:
    """Raise when two splits' inclusive date intervals meet (``None`` bounds are open)."""
    for i, (a, a_lo, a_hi, a_text) in enumerate(spans):
        for b, b_lo, b_hi, b_text in spans[i + 1 :]:
            a_before_b = a_hi is not None and b_lo is not None and a_hi < b_lo
            b_before_a = b_hi is not None and a_lo is not None and b_hi < a_lo
            if not (a_before_b or b_before_a):
                raise ValueError(
                    f"split {a!r} ({a_text}) and split {b!r} ({b_text}) overlap: each date may belong to one split"
                )


# What ``split_by_time`` accepts (``validation``); the rows marked Anything are checked against the time axis
SPLIT_BY_TIME_PARAMETERS: Table = {
    "geometry": [Instance(ArrayGeometry, "an ArrayGeometry")],
    "ranges": [Anything("_named_ranges: split names to (start, stop) date bounds")],
    "edges": [Options(*EDGES)],
    "exclude_chunks": [Anything("resolve_exclusions: chunk indices or records of the geometry")],
    "geometries": [Anything("resolve_exclusions: the geometries the records name")],
    "missing": [Anything("declare_times: dates of the geometry's time axis")],
    "frequency": [Anything("declare_times: a multiple of the time axis's step")],
}


@validate_params(SPLIT_BY_TIME_PARAMETERS)
def split_by_time(
    geometry: ArrayGeometry,
    ranges: Mapping[str, tuple[DateBound, DateBound]],
    *,
    edges: Edges = "chunk",
    exclude_chunks: Iterable[int | ChunkRecord] | None = None,
    geometries: Mapping[str, ArrayGeometry] | Iterable[ArrayGeometry] | None = None,
    missing: Iterable[Any] | None = None,
    frequency: str | np.timedelta64 | None = None,
) -> SplitManifest:
    """Splits by date ranges along the sample axis's time coordinate.

    Parameters
    ----------
    geometry
        The anchor array; its sample dimension's coordinate (from the store,
        decoded as xarray decodes it) supplies the dates.
    ranges
        ``{name: (start, stop)}``, both bounds inclusive as written: an ISO
        string names its whole resolution (``"2015-12-31"`` ends at that
        day's last step, ``"2015"`` at the year's), a ``datetime``/``date``/
        ``numpy.datetime64`` (or a ``cftime`` date) is that instant; ``None``
        leaves the end open.
    edges
        ``"chunk"``: each split holds the whole stored chunks inside its
        range; a chunk straddling a boundary is left out and its dates are
        listed in the manifest (``split_dates(name).dropped``). ``"exact"``:
        each sample goes to the split its own date falls in; a straddling
        chunk is read by both splits (``split_dates(name).shared_chunks``).
    exclude_chunks, geometries
        Quarantined chunks, as for ``split_by_chunk``: left out of every
        split (each split's dates and samples count what remains) and never read.
    missing
        Dates no anchor may touch: each a date (a string names its whole
        resolution, as a range bound does) or an inclusive ``(start, end)``
        pair. Every split, rank and pass drops an anchor whose window (any
        label's offsets, or the anchor itself) touches one; inference raises.
    frequency
        Anchors every ``frequency`` (``"12h"``; a whole multiple of the time
        axis's step), counted from the first date: only the chunks those
        anchors and their windows need are read.

    Raises
    ------
    ValueError
        Overlapping ranges; a range with no sample (or, with
        ``edges="chunk"``, no whole chunk, or none left by the quarantine);
        the coordinate holds no dates or does not increase; the store has no
        coordinate for the sample axis; an unknown ``edges``; a bound that is
        not a date; a quarantined chunk outside its array or of an array not given.
    CalendarError
        The coordinate's calendar needs ``cftime``, which is not installed.
    TimeAxisError
        A ``frequency`` that is no whole multiple of the time axis's step.
    TypeError
        ``ranges`` is not a mapping of ``(start, stop)`` pairs, or a bound is no date-like.
    """
    named = _named_ranges(ranges)
    excluded = resolve_exclusions(geometry, exclude_chunks, geometries)
    dim, values = sample_coordinate([geometry])
    axis = TimeAxis.of(values) if is_time(values) else None
    if axis is None:
        raise ValueError(
            f"coordinate {dim!r} of {geometry.path!r} holds no dates (dtype {values.dtype}, no CF time units); "
            "split_by_chunk(sample_range=...) splits by index"
        )
    missing_dates, spacing = declare_times(geometry, missing, frequency)
    manifest = _date_manifest(geometry, dim, values, axis, named, edges, excluded)
    return dataclasses.replace(manifest, missing=missing_dates, frequency=spacing)


def _date_manifest(
    geometry: ArrayGeometry,
    dim: str,
    values: np.ndarray,
    axis: TimeAxis,
    named: list[tuple[str, DateBound, DateBound]],
    edges: Edges,
    excluded: tuple[int, ...] = (),
) -> SplitManifest:
    n, size = geometry.n_samples, geometry.sample_chunk_size
    spans = []
    for name, start, stop in named:
        text = f"{format_bound(start) or 'the start'} .. {format_bound(stop) or 'the end'}"
        lo_value, hi_value = _bounds(axis, start, stop, f"split {name!r}")
        spans.append((name, lo_value, hi_value, text))
    _check_disjoint(spans)
    span_of = {name: text for name, _, _, text in spans}
    picked: dict[str, tuple[tuple[int, ...], int, int, list[tuple[int, int]]]] = {}
    for name, start, stop in named:
        lo, hi = coordinate_range(values, start, stop, what=f"split {name!r}")
        if lo >= hi:
            raise ValueError(
                f"split {name!r} ({span_of[name]}) holds no sample: coordinate {dim!r} {_describe_span(axis, values)}"
            )
        if edges == "exact":
            chunks = tuple(range(lo // size, -(-hi // size)))
            picked[name] = (chunks, lo, hi, [])
            continue
        first, end = -(-lo // size), (hi // size if hi < n else -(-n // size))
        if first >= end:
            raise ValueError(
                f"split {name!r} ({span_of[name]}) holds no whole chunk of {size} samples: its "
                f"{hi - lo} samples lie in chunks that straddle its boundaries; pass edges='exact' to keep them"
            )
        kept_lo, kept_hi = first * size, min(end * size, n)
        dropped = [(a, b) for a, b in ((lo, kept_lo), (kept_hi, hi)) if b > a]
        picked[name] = (tuple(range(first, end)), kept_lo, kept_hi, dropped)
    bad = np.zeros(-(-n // size), dtype=bool)
    bad[list(excluded)] = True
    held = {}  # each split's samples once its quarantined chunks are out
    for name, (chunks, lo, hi, dropped) in picked.items():
        chunks = tuple(c for c in chunks if not bad[c])
        idx = np.arange(lo, hi)
        idx = idx[~bad[idx // size]]
        if not len(idx):
            raise ValueError(
                f"split {name!r} ({span_of[name]}) holds no sample once the quarantined chunks "
                f"{list(excluded)} are left out"
            )
        picked[name] = (chunks, lo, hi, dropped)
        held[name] = idx
    readers: dict[int, int] = {}
    for chunks, *_ in picked.values():
        for c in chunks:
            readers[c] = readers.get(c, 0) + 1
    dates = []
    for name, start, stop in named:
        chunks, lo, hi, dropped = picked[name]
        idx = held[name]
        dates.append(
            (
                name,
                SplitDates(
                    start=format_bound(start),
                    stop=format_bound(stop),
                    first=axis.format(values[idx[0]]),
                    last=axis.format(values[idx[-1]]),
                    samples=len(idx),
                    dropped=tuple(
                        DateRun(axis.format(values[a]), axis.format(values[b - 1]), b - a) for a, b in dropped
                    ),
                    shared_chunks=tuple(c for c in chunks if readers[c] > 1),
                ),
            )
        )
    exact = edges == "exact"
    return SplitManifest(
        array=geometry.path,
        n_samples=n,
        sample_chunk_size=size,
        splits=tuple((name, picked[name][0]) for name, _, _ in named),
        sample_range=(min(p[1] for p in picked.values()), max(p[2] for p in picked.values())),
        fractions=(),
        contiguous=True,
        seed=0,
        sample_ranges=tuple((name, (picked[name][1], picked[name][2])) for name, _, _ in named) if exact else (),
        dim=dim,
        edges=edges,
        dates=tuple(dates),
        excluded_chunks=excluded,
    )
