"""Half-open integer intervals ``(start, stop)``: merge, subtract, overlap."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-adjacent intervals covering the same indices."""
    out: list[Interval] = []
    for start, stop in sorted(i for i in intervals if i[0] < i[1]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def subtract(span: Interval, taken: Iterable[Interval]) -> list[Interval]:
    """The parts of ``span`` no interval of ``taken`` covers, in order."""
    gaps: list[Interval] = []
    cursor, end = span
    for start, stop in merge(taken):
        if stop <= cursor or start >= end:
            continue
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, stop)
    if cursor < end:
        gaps.append((cursor, end))
    return gaps


def overlaps(a: Interval, b: Interval) -> bool:
    """Whether two half-open intervals share an index."""
    return a[0] < b[1] and b[0] < a[1]
