"""What an output group's writers have done: its claims and coverage at one moment, and clearing them.

``write_status`` reads the claim and coverage records (``claims``) of a
group; ``clear_stale_claims`` and ``clear_coverage`` are the explicit
recoveries (``insitubatch write-status --clear-stale``/``--clear-coverage``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from zarr.abc.store import Store

from ._intervals import Interval, merge, overlaps, subtract
from .claims import CLAIMS, COVERAGE, ClaimInfo, CoverageRecord
from .coords import IndexCoordinate
from .layout import read_layout
from .records import RecordStore

__all__ = ["WriteStatus", "clear_coverage", "clear_stale_claims", "write_status"]


@dataclass(frozen=True)
class WriteStatus:
    """Claims and coverage of an output group at one moment.

    ``remaining`` is every range not recorded complete, whether claimed or not.
    ``coord`` is the layout's index coordinate, when it stores one: ranges are
    then also shown by it (:meth:`describe`, and ``first``/``last`` in
    :meth:`to_dict`).
    """

    group: str
    extent: int
    alignment: int
    claims: tuple[ClaimInfo, ...]
    coverage: tuple[CoverageRecord, ...]
    completed: tuple[Interval, ...]
    remaining: tuple[Interval, ...]
    now: float
    coord: IndexCoordinate | None = field(default=None, compare=False, repr=False)

    @property
    def stale_claims(self) -> tuple[ClaimInfo, ...]:
        """Claims whose holder stopped heartbeating."""
        return tuple(c for c in self.claims if c.is_stale(self.now))

    @property
    def live_claims(self) -> tuple[ClaimInfo, ...]:
        """Claims whose holder is heartbeating."""
        return tuple(c for c in self.claims if not c.is_stale(self.now))

    def describe(self, start: int, stop: int) -> str:
        """``[start, stop)``, with the index coordinate of its first and last index when the layout has one."""
        return f"[{start}, {stop})" if self.coord is None else self.coord.describe(start, stop)

    def _labels(self, start: int, stop: int) -> dict[str, str | None]:
        if self.coord is None:
            return {}
        first, last = self.coord.span(start, stop)
        return {"first": first, "last": last}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (with each range's first and last coordinate when the layout has an index coordinate)."""
        out = {
            "group": self.group,
            "extent": self.extent,
            "alignment": self.alignment,
            "now": self.now,
            "claims": [
                {
                    **c.payload(),
                    **self._labels(c.start, c.stop),
                    "stale": c.is_stale(self.now),
                    "age_s": c.age(self.now),
                }
                for c in self.claims
            ],
            "coverage": [{**c.payload(), **self._labels(c.start, c.stop)} for c in self.coverage],
            "completed": [list(r) for r in self.completed],
            "remaining": [list(r) for r in self.remaining],
        }
        if self.coord is not None:
            out["index_coord"] = self.coord.name
            out["completed_coords"] = [list(self.coord.span(*r)) for r in self.completed]
            out["remaining_coords"] = [list(self.coord.span(*r)) for r in self.remaining]
        return out


def _read_claims(store: Store, group: str) -> tuple[ClaimInfo, ...]:
    found = RecordStore(store, group, CLAIMS).payloads().values()
    return tuple(sorted((ClaimInfo.from_payload(p) for p in found), key=lambda c: (c.start, c.stop)))


def _read_coverage(store: Store, group: str) -> tuple[CoverageRecord, ...]:
    found = RecordStore(store, group, COVERAGE).payloads().values()
    return tuple(sorted((CoverageRecord.from_payload(p) for p in found), key=lambda c: (c.start, c.stop)))


def write_status(store: Store, group: str = "", *, now: float | None = None) -> WriteStatus:
    """Read the claims and completed coverage of ``group``.

    Parameters
    ----------
    store
        The zarr store (read access suffices).
    group
        Path of the output group.
    now
        Unix time to judge staleness at; defaults to the current time.

    Returns
    -------
    WriteStatus

    Raises
    ------
    LayoutMismatchError
        ``group`` has no write layout.
    """
    group = group.strip("/")
    layout = read_layout(store, group)
    coverage = _read_coverage(store, group)
    completed = merge((c.start, c.stop) for c in coverage)
    return WriteStatus(
        group=group,
        extent=layout.extent,
        alignment=layout.alignment,
        claims=_read_claims(store, group),
        coverage=coverage,
        completed=tuple(completed),
        remaining=tuple(subtract((0, layout.extent), completed)),
        now=time.time() if now is None else now,
        coord=layout.coord,
    )


def clear_stale_claims(store: Store, group: str = "", *, now: float | None = None) -> tuple[ClaimInfo, ...]:
    """Delete every stale claim of ``group`` (a claim refreshed meanwhile is kept).

    Parameters
    ----------
    store
        A writable zarr store.
    group
        Path of the output group.
    now
        Unix time to judge staleness at; defaults to the current time.

    Returns
    -------
    tuple of ClaimInfo
        The claims deleted.
    """
    group = group.strip("/")
    records = RecordStore(store, group, CLAIMS)
    now = time.time() if now is None else now
    cleared = []
    for name, payload in records.payloads().items():
        claim = ClaimInfo.from_payload(payload)
        if not claim.is_stale(now):
            continue
        current = records.read(name)  # the holder may have come back to life
        if current is None or ClaimInfo.from_payload(current[0]) != claim:
            continue
        records.delete(name)
        cleared.append(claim)
    return tuple(cleared)


def clear_coverage(store: Store, start: int, stop: int, *, group: str = "") -> tuple[CoverageRecord, ...]:
    """Forget completed coverage overlapping ``[start, stop)`` so it is planned and written again.

    Parameters
    ----------
    store
        A writable zarr store.
    start, stop
        The half-open range whose coverage records go (any record overlapping it).
    group
        Path of the output group.

    Returns
    -------
    tuple of CoverageRecord
        The records deleted.
    """
    if not 0 <= start < stop:
        raise ValueError(f"range [{start}, {stop}) must satisfy 0 <= start < stop")
    group = group.strip("/")
    records = RecordStore(store, group, COVERAGE)
    cleared = []
    for name, payload in records.payloads().items():
        record = CoverageRecord.from_payload(payload)
        if overlaps((start, stop), (record.start, record.stop)):
            records.delete(name)
            cleared.append(record)
    return tuple(sorted(cleared, key=lambda c: (c.start, c.stop)))
