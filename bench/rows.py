"""What every part of the bench shares: the split it reads, its units, and the arithmetic on result rows.

A row is the JSON dict one measurement returns (``bench.child``); the
report (``bench.run``) and the network scenarios (``bench.network``) both
compare rows by :func:`rate` and take :func:`ratio` of rates, and write
their results through :func:`clean`. This module imports nothing from the
bench, so both can stand on it without importing each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_BANDWIDTH_MB_S",
    "MB",
    "REPO_ROOT",
    "SPLIT_FRACTIONS",
    "best",
    "by_name",
    "clean",
    "rate",
    "ratio",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
MB = 1e6
# train / validation / test, by chunk: every loader of a run reads the same train split
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
# A single object-store stream moves on the order of 100 MB/s.
DEFAULT_BANDWIDTH_MB_S = 100.0


def rate(row: dict[str, Any] | None) -> float:
    """The rate a row is compared by (``rate_samples_per_s``); NaN for a failed or missing row."""
    if not row or row.get("error"):
        return math.nan
    value = row.get("rate_samples_per_s")
    return float(value) if value is not None else math.nan


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is NaN or ``b`` is zero (a missing row never becomes a number)."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def best(rows: Sequence[dict[str, Any]], loaders: Sequence[str]) -> dict[str, Any] | None:
    """The fastest row of one of ``loaders``, or ``None`` when none of them measured a rate."""
    candidates = [r for r in rows if r["loader"] in loaders and not math.isnan(rate(r))]
    return max(candidates, key=rate) if candidates else None


def by_name(rows: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The row called ``name``, or ``None``."""
    return next((r for r in rows if r["name"] == name), None)


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value
