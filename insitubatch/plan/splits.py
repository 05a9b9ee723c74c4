"""Train/val/test splits along the sample axis: the ``SplitManifest`` and ``split_by_chunk``.

A manifest assigns sample-axis chunks to splits. Chunk-granular splits
(``split_by_chunk``, and ``split_by_time`` by default) give whole stored
chunks to one split each, so no sample straddles a split boundary and every
read serves exactly one split. A split may also carry an anchor range that
restricts it to part of its chunks (``split_by_time(edges="exact")``): its
first and last chunk are then read by the neighbouring split as well. A
date split records its dates (``SplitDates``), which ``describe()`` prints.
Quarantined chunks (``exclude_chunks``, see ``quarantine``) are in no split.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..io.geometry import ArrayGeometry
from ..validation import Anything, Flag, Instance, Interval, Table, validate_params
from .anchors import declare_times, times_lines
from .quarantine import ChunkRecord, check_excluded, excluded_runs, resolve_exclusions

__all__ = ["DateRun", "SplitDates", "SplitManifest", "split_by_chunk"]

DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
DEFAULT_NAMES = ("train", "val", "test")
# fractions are floats a user types; this much slack in their sum is rounding, not a mistake
FRACTION_SUM_TOLERANCE = 1e-6
# JSON format of a manifest. Format 1 (chunk lists only) still loads, and a manifest
# without anchor ranges, dates or quarantined chunks still saves as format 1, so the
# fingerprint a saved position resumes against is the same as before format 2 existed.
# Format 3 adds quarantined chunks: a library that predates it refuses such a manifest
# rather than ignore the quarantine and read the bad chunks through a window.
MANIFEST_FORMAT = 2
CHUNK_ONLY_FORMAT = 1
QUARANTINE_FORMAT = 3
# Format 4 adds missing dates and a frequency: refused, not ignored, by a library that predates them.
TIMES_FORMAT = 4
FORMATS = (CHUNK_ONLY_FORMAT, MANIFEST_FORMAT, QUARANTINE_FORMAT, TIMES_FORMAT)


@dataclass(frozen=True)
class DateRun:
    """Consecutive samples by date: the first and last date (ISO) and how many samples."""

    first: str
    last: str
    samples: int

    def __str__(self) -> str:
        if self.samples == 1:
            return f"{self.first} (1 sample)"
        return f"{self.first} .. {self.last} ({self.samples} samples)"


@dataclass(frozen=True)
class SplitDates:
    """One date split, as asked and as made.

    ``start``/``stop`` are the bounds as written (inclusive, ``None`` open);
    ``first``/``last`` the dates of the split's first and last sample;
    ``dropped`` the runs of dates inside the bounds that the split leaves out
    (chunks straddling a boundary, under ``edges="chunk"``);
    ``shared_chunks`` the chunks another split reads too (``edges="exact"``).
    """

    start: str | None
    stop: str | None
    first: str | None
    last: str | None
    samples: int
    dropped: tuple[DateRun, ...] = ()
    shared_chunks: tuple[int, ...] = ()


def _dates_to_json(d: SplitDates) -> dict[str, Any]:
    return {
        "start": d.start,
        "stop": d.stop,
        "first": d.first,
        "last": d.last,
        "samples": d.samples,
        "dropped": [{"first": r.first, "last": r.last, "samples": r.samples} for r in d.dropped],
        "shared_chunks": list(d.shared_chunks),
    }


def _dates_from_json(d: Mapping[str, Any]) -> SplitDates:
    def text(v: Any) -> str | None:
        return None if v is None else str(v)

    return SplitDates(
        start=text(d["start"]),
        stop=text(d["stop"]),
        first=text(d["first"]),
        last=text(d["last"]),
        samples=int(d["samples"]),
        dropped=tuple(DateRun(str(r["first"]), str(r["last"]), int(r["samples"])) for r in d.get("dropped", ())),
        shared_chunks=tuple(int(c) for c in d.get("shared_chunks", ())),
    )


@dataclass(frozen=True)
class SplitManifest:
    """Which sample-axis chunks (global indices) belong to each split.

    ``sample_chunk_size`` and ``n_samples`` describe the reference (anchor)
    grid the chunk indices refer to: chunk ``c`` holds anchors
    ``[c * sample_chunk_size, min((c + 1) * sample_chunk_size, n_samples))``.
    ``sample_ranges`` restricts a split to the anchors ``[start, stop)`` of
    its chunks (a split not listed has every anchor of its chunks). A date
    split (``split_by_time``) also records the dimension it was cut along,
    its ``edges`` rule and each split's ``SplitDates``. ``excluded_chunks``
    are quarantined anchor-grid chunks: in no split, and never read.
    ``missing`` are declared missing dates (``(first, last)`` as written, both
    inclusive) and ``frequency`` the anchors' spacing (``"12h"``): no split
    draws an anchor whose window touches a missing date, or off the frequency
    (``anchors``).
    """

    array: str
    n_samples: int
    sample_chunk_size: int
    splits: tuple[tuple[str, tuple[int, ...]], ...]
    sample_range: tuple[int, int]
    fractions: tuple[float, ...]
    contiguous: bool
    seed: int
    sample_ranges: tuple[tuple[str, tuple[int, int]], ...] = ()
    dim: str | None = None
    edges: str | None = None
    dates: tuple[tuple[str, SplitDates], ...] = ()
    excluded_chunks: tuple[int, ...] = ()
    missing: tuple[tuple[str, str], ...] = ()
    frequency: str | None = None

    def __post_init__(self) -> None:
        check_excluded(self.excluded_chunks, self.sample_chunk_size, self.n_samples)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)

    def chunks(self, name: str) -> tuple[int, ...]:
        """Global chunk indices of split ``name``, ascending."""
        for n, chunks in self.splits:
            if n == name:
                return chunks
        raise KeyError(f"split {name!r} is not in the manifest; splits are {list(self.names)}")

    def __getitem__(self, name: str) -> tuple[int, ...]:
        return self.chunks(name)

    def asked_empty(self, name: str) -> bool:
        """Whether split ``name`` was asked to be empty (a fraction of 0): it yields nothing, silently."""
        names = self.names
        return bool(self.fractions) and name in names and self.fractions[names.index(name)] == 0

    def chunk_len(self, chunk_index: int) -> int:
        return min(self.sample_chunk_size, self.n_samples - chunk_index * self.sample_chunk_size)

    def split_range(self, name: str) -> tuple[int, int] | None:
        """The anchors ``[start, stop)`` split ``name`` is restricted to, or ``None`` for all of its chunks."""
        self.chunks(name)  # raises KeyError naming the splits
        for n, bounds in self.sample_ranges:
            if n == name:
                return bounds
        return None

    def sample_indices(self, name: str) -> np.ndarray:
        """Every sample index (anchor) of split ``name``, ascending."""
        parts = [
            np.arange(c * self.sample_chunk_size, c * self.sample_chunk_size + self.chunk_len(c))
            for c in self.chunks(name)
        ]
        out = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        bounds = self.split_range(name)
        if bounds is not None:
            out = out[(out >= bounds[0]) & (out < bounds[1])]
        return out

    def split_dates(self, name: str) -> SplitDates:
        """What date split ``name`` asked for and holds.

        Raises
        ------
        KeyError
            No such split, or the manifest was not made by ``split_by_time``.
        """
        self.chunks(name)
        for n, dates in self.dates:
            if n == name:
                return dates
        raise KeyError(f"split {name!r} has no dates: the manifest was made by split_by_chunk, not split_by_time")

    def describe(self, variables: Mapping[str, ArrayGeometry] | None = None) -> str:
        """Each split's samples and chunks, and for a date split its first and last date, what it left out or shares.

        Also its missing dates and frequency; with ``variables`` (the dataset's ``{label: ArrayGeometry}``), how
        many anchors each split loses to its times and the first times it lacks.
        """
        by = f" along {self.dim!r}" if self.dim else ""
        head = f"SplitManifest of {self.array!r}: {self.n_samples} samples{by}, {self.sample_chunk_size} per chunk; "
        if self.dates:
            rule = {"chunk": "whole chunks only", "exact": "each sample by its own date"}.get(str(self.edges), "")
            head += f"split by date, edges={self.edges!r} ({rule})"
        else:
            order = "contiguous" if self.contiguous else f"chunks permuted with seed={self.seed}"
            head += f"split by chunk fractions {list(self.fractions)}, {order}"
        lines = [head]
        width = max(len(n) for n in self.names) if self.splits else 0
        dates = dict(self.dates)
        for name, chunks in self.splits:
            samples = self.sample_indices(name)
            count = f"{len(samples)} samples in {len(chunks)} chunks"
            d = dates.get(name)
            if d is None:
                runs = self.contiguous or self.split_range(name) is not None
                where = f"samples {samples[0]} .. {samples[-1]}: " if len(samples) and runs else ""
                lines.append(f"  {name:<{width}}  {where}{count}")
                continue
            lines.append(
                f"  {name:<{width}}  {d.first} .. {d.last}: {count} "
                f"(asked {d.start or 'the start'} .. {d.stop or 'the end'})"
            )
            for run in d.dropped:
                lines.append(f"  {'':<{width}}  left out {run}: in a chunk that straddles the split's boundary")
            if len(d.shared_chunks) == 1:
                lines.append(
                    f"  {'':<{width}}  chunk {d.shared_chunks[0]} straddles a boundary: another split reads it too"
                )
            elif d.shared_chunks:
                shared = ", ".join(str(c) for c in d.shared_chunks)
                lines.append(f"  {'':<{width}}  chunks {shared} straddle boundaries: other splits read them too")
        if self.excluded_chunks:
            bad = excluded_runs(self.excluded_chunks, self.sample_chunk_size, self.n_samples)
            lines.append(
                f"  quarantined: chunks {', '.join(str(c) for c in self.excluded_chunks)} "
                f"(samples {', '.join(f'{a} .. {b - 1}' for a, b in bad)}): in no split, never read"
            )
        return "\n".join(lines + times_lines(self, variables))

    def __str__(self) -> str:
        return self.describe()

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "array": self.array,
            "n_samples": self.n_samples,
            "sample_chunk_size": self.sample_chunk_size,
            "splits": {name: list(chunks) for name, chunks in self.splits},
            "sample_range": list(self.sample_range),
            "fractions": list(self.fractions),
            "contiguous": self.contiguous,
            "seed": self.seed,
        }
        if self.sample_ranges or self.dates:
            doc["sample_ranges"] = {name: list(bounds) for name, bounds in self.sample_ranges}
            doc["dim"] = self.dim
            doc["edges"] = self.edges
            doc["dates"] = {name: _dates_to_json(d) for name, d in self.dates}
        else:
            doc["format"] = CHUNK_ONLY_FORMAT
        if self.excluded_chunks:
            doc["format"] = QUARANTINE_FORMAT
            doc["excluded_chunks"] = list(self.excluded_chunks)
        if self.missing or self.frequency is not None:
            doc.update(format=TIMES_FORMAT, missing=[list(p) for p in self.missing], frequency=self.frequency)
        return json.dumps(doc, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> SplitManifest:
        try:
            d = json.loads(text)
            if d.get("format") not in FORMATS:
                raise ValueError(f"manifest format {d.get('format')!r} is not a supported one {FORMATS}")
            return cls(
                array=str(d["array"]),
                n_samples=int(d["n_samples"]),
                sample_chunk_size=int(d["sample_chunk_size"]),
                splits=tuple((str(k), tuple(int(c) for c in v)) for k, v in d["splits"].items()),
                sample_range=(int(d["sample_range"][0]), int(d["sample_range"][1])),
                fractions=tuple(float(f) for f in d["fractions"]),
                contiguous=bool(d["contiguous"]),
                seed=int(d["seed"]),
                sample_ranges=tuple((str(k), (int(v[0]), int(v[1]))) for k, v in d.get("sample_ranges", {}).items()),
                dim=None if d.get("dim") is None else str(d["dim"]),
                edges=None if d.get("edges") is None else str(d["edges"]),
                dates=tuple((str(k), _dates_from_json(v)) for k, v in d.get("dates", {}).items()),
                excluded_chunks=tuple(int(c) for c in d.get("excluded_chunks", ())),
                missing=tuple((str(a), str(b)) for a, b in d.get("missing", ())),
                frequency=None if d.get("frequency") is None else str(d["frequency"]),
            )
        except (KeyError, TypeError, IndexError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a SplitManifest JSON document: {exc}") from exc

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @classmethod
    def load(cls, path: str) -> SplitManifest:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def fingerprint(self) -> str:
        """16-hex digest of the manifest's content (for resume checks)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def _named_fractions(fractions: Sequence[float] | Mapping[str, float]) -> list[tuple[str, float]]:
    if isinstance(fractions, Mapping):
        items = [(str(k), v) for k, v in fractions.items()]
    else:
        fr = list(fractions)
        if not 1 <= len(fr) <= len(DEFAULT_NAMES):
            raise ValueError(
                f"fractions={tuple(fr)} must have 1 to {len(DEFAULT_NAMES)} entries "
                f"(for {DEFAULT_NAMES}), or be a mapping of split name to fraction"
            )
        items = list(zip(DEFAULT_NAMES, fr))
    if not items:
        raise ValueError("fractions must name at least one split")
    out = []
    for name, f in items:
        if isinstance(f, bool) or not isinstance(f, (int, float, np.floating, np.integer)):
            raise TypeError(f"fraction for split {name!r} must be a number, got {f!r}")
        f = float(f)
        if not (math.isfinite(f) and 0.0 <= f <= 1.0):
            raise ValueError(f"fraction for split {name!r} is {f}; each fraction must be in [0, 1]")
        out.append((name, f))
    total = sum(f for _, f in out)
    if abs(total - 1.0) > FRACTION_SUM_TOLERANCE:
        raise ValueError(f"fractions {dict(out)} sum to {total}; they must sum to 1")
    return out


def _allocate(n: int, named: list[tuple[str, float]], quarantined: int = 0) -> list[int]:
    """Split ``n`` chunks by fraction: the largest-remainder rule (exact total), then one chunk at least for
    every split with a non-zero fraction, each taken from the split furthest over its share.

    Raises ``ValueError`` when there are fewer chunks than non-zero fractions (``quarantined`` more were left out).
    """
    fractions = [f for _, f in named]
    wanted = [name for name, f in named if f > 0]
    if n < len(wanted):
        raise ValueError(
            f"{len(wanted)} splits have a non-zero fraction ({', '.join(repr(w) for w in wanted)}) but the range "
            f"holds {n} chunk(s){f' besides {quarantined} quarantined' if quarantined else ''}, and a split takes "
            "whole chunks: give fewer splits a fraction, widen sample_range, or rechunk the sample axis finer"
        )
    raw = [f * n for f in fractions]
    counts = [int(math.floor(r)) for r in raw]
    left = n - sum(counts)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    for i, f in enumerate(fractions):
        if f > 0 and counts[i] == 0:
            donor = max((j for j in range(len(counts)) if counts[j] > 1), key=lambda j: (counts[j] - raw[j], -j))
            counts[donor] -= 1
            counts[i] = 1
    return counts


# What ``split_by_chunk`` accepts (``validation``); the rows marked Anything are checked against the geometry
SPLIT_BY_CHUNK_PARAMETERS: Table = {
    "geometry": [Instance(ArrayGeometry, "an ArrayGeometry")],
    "fractions": [Anything("_named_fractions: 1 to 3 fractions, or split names to fractions, in [0, 1], sum <= 1")],
    "contiguous": [Flag()],
    "sample_range": [Anything("a (start, stop) pair inside the geometry's sample axis, or None for all of it")],
    "seed": [Interval(0)],
    "exclude_chunks": [Anything("resolve_exclusions: chunk indices or records of the geometry")],
    "geometries": [Anything("resolve_exclusions: the geometries the records name")],
    "missing": [Anything("declare_times: dates of the geometry's time axis")],
    "frequency": [Anything("declare_times: a multiple of the time axis's step")],
}


@validate_params(SPLIT_BY_CHUNK_PARAMETERS)
def split_by_chunk(
    geometry: ArrayGeometry,
    *,
    fractions: Sequence[float] | Mapping[str, float] = DEFAULT_FRACTIONS,
    contiguous: bool = True,
    sample_range: tuple[int, int] | None = None,
    seed: int = 0,
    exclude_chunks: Iterable[int | ChunkRecord] | None = None,
    geometries: Mapping[str, ArrayGeometry] | Iterable[ArrayGeometry] | None = None,
    missing: Iterable[Any] | None = None,
    frequency: str | np.timedelta64 | None = None,
) -> SplitManifest:
    """Assign whole sample-axis chunks of ``geometry`` to splits.

    Parameters
    ----------
    fractions
        Fractions of chunks (not samples) per split: up to three numbers for
        ``train``/``val``/``test``, or a ``{name: fraction}`` mapping. Must sum to 1.
        Chunks go by the largest-remainder rule, except that a split with a
        non-zero fraction always gets a chunk; a fraction of 0 asks for an
        empty split (iterating it yields nothing, and nothing warns).
    contiguous
        Each split is one run of consecutive chunks (safe for autocorrelated
        series). ``False`` permutes chunks by ``seed`` first (exchangeable samples).
    sample_range
        ``(start, stop)`` sample indices; the chunks overlapping it (snapped
        outward to chunk boundaries) are split.
    seed
        Seed of the chunk permutation when ``contiguous=False``.
    exclude_chunks
        Quarantined chunks, left out of every split and never read (not
        through a window either): anchor-grid chunk indices, or bad-chunk
        records (``ds.bad_chunks``) of ``geometry``'s array or of one in
        ``geometries``. Fractions are of the chunks that remain.
    geometries
        The other arrays records may name (``open_geometries(store)``), to
        map their chunks onto ``geometry``'s grid.
    missing, frequency
        Declared missing dates (dates, or ``(start, end)`` pairs, both
        inclusive; a string names its whole resolution) and the anchors'
        spacing (``"12h"``, a multiple of the time axis's step), by the
        sample axis's time coordinate: every split (and rank) drops the
        anchors whose window touches a missing date, or off the frequency.

    Raises
    ------
    ValueError
        Fractions not in [0, 1] or not summing to 1, fewer chunks in the
        range than splits with a non-zero fraction (each gets one chunk at
        least), a range outside the array, a negative seed, or a quarantined
        chunk outside its array or of an array not given.
    TimeAxisError
        ``missing`` or ``frequency`` on an array without a time coordinate, or
        a frequency that is no multiple of its step.
    """
    named = _named_fractions(fractions)
    missing_dates, spacing = declare_times(geometry, missing, frequency)
    n_samples, size = geometry.n_samples, geometry.sample_chunk_size
    if sample_range is None:
        start, stop = 0, n_samples
    else:
        try:
            start, stop = (int(x) for x in sample_range)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"sample_range={sample_range!r} must be a (start, stop) pair of ints") from exc
        if not 0 <= start < stop <= n_samples:
            raise ValueError(
                f"sample_range={(start, stop)} must satisfy 0 <= start < stop <= {n_samples} "
                f"(the length of {geometry.path!r} along its sample axis)"
            )
    excluded = resolve_exclusions(geometry, exclude_chunks, geometries)
    first, last = start // size, -(-stop // size)
    chunks = np.arange(first, last, dtype=np.int64)
    bad = np.zeros(geometry.n_chunks, dtype=bool)
    bad[list(excluded)] = True
    quarantined = bad[chunks]
    chunks = chunks[~quarantined]
    if not contiguous:
        chunks = np.random.default_rng(int(seed)).permutation(chunks)
    counts = _allocate(len(chunks), named, int(quarantined.sum()))
    bounds = np.cumsum([0, *counts])
    splits = tuple(
        (name, tuple(sorted(int(c) for c in chunks[bounds[i] : bounds[i + 1]]))) for i, (name, _) in enumerate(named)
    )
    return SplitManifest(
        array=geometry.path,
        n_samples=n_samples,
        sample_chunk_size=size,
        splits=splits,
        sample_range=(start, stop),
        fractions=tuple(f for _, f in named),
        contiguous=bool(contiguous),
        seed=int(seed),
        excluded_chunks=excluded,
        missing=missing_dates,
        frequency=spacing,
    )
