"""Quarantined chunks: sample-axis chunks known to be bad, left out of every split and never read.

A manifest's ``excluded_chunks`` are chunks of its anchor grid.
``split_by_chunk`` and ``split_by_time`` take them as indices, or as a
dataset's ``bad_chunks`` records (an array path and a chunk index on that
array's own sample-axis grid) mapped onto the anchor grid: a chunk of an
array chunked differently along the sample axis covers one anchor-grid chunk
or several, and all of them are quarantined, so none of the bad chunk's
samples is read. A pass never reads a quarantined sample: not as an anchor,
and not through another anchor's offset or window either (the epoch order
drops such anchors, as it drops windows that run off the array).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeGuard

import numpy as np

from ..io.geometry import ArrayGeometry

__all__ = [
    "ChunkRecord",
    "check_excluded",
    "drop_quarantined",
    "excluded_runs",
    "quarantine_note",
    "resolve_exclusions",
    "usable_rows",
]


class ChunkRecord(Protocol):
    """A chunk of one array that failed: what ``ds.bad_chunks`` lists (``BadChunkRecord``)."""

    @property
    def array(self) -> str: ...

    @property
    def chunk_index(self) -> int: ...


def _is_record(item: object) -> TypeGuard[ChunkRecord]:
    """A bad-chunk record (``BadChunkRecord``, from ``ds.bad_chunks``): an array path and a chunk index."""
    return isinstance(getattr(item, "array", None), str) and hasattr(item, "chunk_index")


def _record_geometry(record: Any, anchor: ArrayGeometry, others: Mapping[str, ArrayGeometry]) -> ArrayGeometry:
    if record.array == anchor.path:
        return anchor
    g = others.get(record.array)
    if g is None:
        known = sorted({anchor.path, *others})
        raise ValueError(
            f"exclude_chunks: a bad-chunk record names array {record.array!r}, whose sample-axis chunking "
            f"this split does not know (it knows {known}); pass that array's geometry as well: "
            "geometries=open_geometries(store)"
        )
    if g.n_samples != anchor.n_samples:
        raise ValueError(
            f"exclude_chunks: array {record.array!r} has {g.n_samples} samples along its sample axis and "
            f"{anchor.path!r} {anchor.n_samples}; a record maps onto the anchor grid only between arrays of one length"
        )
    return g


def _by_path(geometries: Mapping[str, ArrayGeometry] | Iterable[ArrayGeometry] | None) -> dict[str, ArrayGeometry]:
    """Geometries by array path (a mapping may be keyed by label: its values' paths count)."""
    if geometries is None:
        return {}
    values = geometries.values() if isinstance(geometries, Mapping) else geometries
    out: dict[str, ArrayGeometry] = {}
    for g in values:
        if not isinstance(g, ArrayGeometry):
            raise TypeError(f"geometries must hold ArrayGeometry values (open_geometries), got {type(g).__name__}")
        out.setdefault(g.path, g)
    return out


def resolve_exclusions(
    anchor: ArrayGeometry,
    exclude_chunks: Iterable[int | ChunkRecord] | None,
    geometries: Mapping[str, ArrayGeometry] | Iterable[ArrayGeometry] | None = None,
) -> tuple[int, ...]:
    """The anchor-grid chunks ``exclude_chunks`` names, sorted and unique.

    Each item is a chunk index of ``anchor``'s grid, or a bad-chunk record
    of ``anchor``'s array or of one of ``geometries`` (mapped onto every
    anchor chunk its samples fall in).

    Raises
    ------
    TypeError
        ``exclude_chunks`` is not an iterable of ints and records.
    ValueError
        A chunk outside its array, or a record of an array not given or of another length.
    """
    if exclude_chunks is None:
        return ()
    if (
        isinstance(exclude_chunks, str | bytes)
        or _is_record(exclude_chunks)
        or not isinstance(exclude_chunks, Iterable)
    ):
        raise TypeError(
            "exclude_chunks must be an iterable of anchor-grid chunk indices or bad-chunk records "
            f"(ds.bad_chunks), got {type(exclude_chunks).__name__}"
        )
    others = _by_path(geometries)
    size, n = anchor.sample_chunk_size, anchor.n_samples
    out: set[int] = set()
    for item in exclude_chunks:
        if _is_record(item):
            g = _record_geometry(item, anchor, others)
            k = _chunk_index(item.chunk_index, g, f"record of {item.array!r}")
            lo, hi = k * g.sample_chunk_size, min((k + 1) * g.sample_chunk_size, n)
            out.update(range(lo // size, -(-hi // size)))
        elif isinstance(item, int | np.integer) and not isinstance(item, bool):
            out.add(_chunk_index(item, anchor, "chunk"))
        else:
            raise TypeError(
                f"exclude_chunks holds {item!r} ({type(item).__name__}): each item must be an anchor-grid chunk "
                "index or a bad-chunk record (ds.bad_chunks)"
            )
    return tuple(sorted(out))


def _chunk_index(value: Any, g: ArrayGeometry, what: str) -> int:
    k = int(value)
    if not 0 <= k < g.n_chunks:
        raise ValueError(
            f"exclude_chunks: {what} {k} is outside the array: {g.path!r} has {g.n_chunks} chunks of "
            f"{g.sample_chunk_size} samples along its sample axis (0 .. {g.n_chunks - 1})"
        )
    return k


def check_excluded(excluded: tuple[int, ...], chunk_size: int, n_samples: int) -> None:
    """Raise ``ValueError`` for a quarantined chunk outside the anchor grid (a manifest edited by hand)."""
    n_chunks = -(-n_samples // chunk_size) if chunk_size > 0 else 0
    outside = [c for c in excluded if not 0 <= c < n_chunks]
    if outside:
        raise ValueError(
            f"excluded_chunks {outside} lie outside the anchor grid: {n_samples} samples in chunks of "
            f"{chunk_size} make {n_chunks} chunks (0 .. {n_chunks - 1})"
        )


def usable_rows(
    anchors: np.ndarray,
    excluded: Iterable[int],
    chunk_size: int,
    n_samples: int,
    offsets: Iterable[int],
    rows: Iterable[np.ndarray] = (),
) -> np.ndarray:
    """Which ``anchors`` read no quarantined sample: at the anchor itself, at each of ``offsets``, and at
    each column of ``rows`` (``(len(anchors), steps)`` read indices of labels offset in time)."""
    n_chunks = -(-n_samples // chunk_size)
    bad = np.zeros(n_chunks, dtype=bool)
    bad[list(excluded)] = True
    keep = np.ones(len(anchors), dtype=bool)
    columns = [anchors + off for off in {0, *offsets}] + [r[:, j] for r in rows for j in range(r.shape[1])]
    for at in columns:
        inside = (at >= 0) & (at < n_samples)  # a window off the array is dropped elsewhere, with its own reason
        keep &= ~(inside & bad[np.clip(at, 0, n_samples - 1) // chunk_size])
    return keep


def drop_quarantined(
    rows: np.ndarray, counts: np.ndarray, manifest: Any, variables: Mapping[str, ArrayGeometry]
) -> tuple[np.ndarray, np.ndarray]:
    """Ledger rows ``[chunk, within]`` (``counts`` per chunk) less those whose anchor reads a quarantined chunk.

    ``manifest`` is the ``SplitManifest`` the rows are on; an anchor is
    dropped when it, or its sample at any label's read offset, lies in one
    of its ``excluded_chunks``.
    """
    if not manifest.excluded_chunks:
        return rows, counts
    size = manifest.sample_chunk_size
    offsets = {off for g in variables.values() if g.time_rows is None for off in g.read_offsets}
    anchors = rows[:, 0] * size + rows[:, 1]
    # (a joined store's label reads rows of its own store's array, on no chunk of the manifest's grid)
    timed = [
        g.read_rows(anchors) for g in variables.values() if g.time_rows is not None and g.time_rows.read_axis is None
    ]
    keep = usable_rows(anchors, manifest.excluded_chunks, size, manifest.n_samples, offsets, timed)
    owner = np.repeat(np.arange(len(counts)), counts)
    return rows[keep], np.bincount(owner[keep], minlength=len(counts)).astype(counts.dtype)


def excluded_runs(excluded: Iterable[int], chunk_size: int, n_samples: int) -> list[tuple[int, int]]:
    """The quarantined samples as half-open runs ``[start, stop)``: adjacent chunks make one run."""
    runs: list[tuple[int, int]] = []
    for c in sorted(excluded):
        lo, hi = c * chunk_size, min((c + 1) * chunk_size, n_samples)
        if runs and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return runs


def quarantine_note(excluded: Iterable[int], chunk_size: int, n_samples: int) -> str:
    """One sentence naming the quarantined chunks (at least one) and their samples."""
    chunks = sorted(excluded)
    samples = ", ".join(f"{a} .. {b - 1}" for a, b in excluded_runs(chunks, chunk_size, n_samples))
    which = f"chunk {chunks[0]}" if len(chunks) == 1 else f"chunks {', '.join(str(c) for c in chunks)}"
    return (
        f"quarantined: {which} of the anchor grid (samples {samples}) left out of every split; "
        "no pass reads them, nor an anchor whose window reaches them"
    )
