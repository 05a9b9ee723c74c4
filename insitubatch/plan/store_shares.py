"""Each member store's share of a plan's reads, for a dataset over several stores (``describe()``).

A store made of several (``join_stores``, ``concat_stores``) says which member
serves a read (``member_of_read``); any other store has no shares to report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .epoch import EpochPlan

__all__ = ["store_shares"]


def store_shares(
    store: Any, plans: Mapping[str, EpochPlan], sources: Mapping[str, tuple[str, int]]
) -> dict[str, dict[str, Any]] | None:
    """Per member store: its tile reads in each split's plan and its share of them all, or ``None``.

    ``sources`` maps each read source to ``(array path, tiles one chunk read of it fetches)``.
    """
    member_of = getattr(store, "member_of_read", None)
    members = getattr(store, "members", None)
    if member_of is None or members is None:
        return None
    per_split: dict[str, Counter[str]] = {}
    for name, plan in plans.items():
        counts: Counter[str] = Counter()
        for source, chunk in plan.reads:
            path, tiles = sources[source]
            counts[member_of(path, int(chunk))] += tiles
        per_split[name] = counts
    total = sum(sum(c.values()) for c in per_split.values())
    times = getattr(store, "report", {})  # a join's: each member's steps, and those left out
    return {
        member: {
            "store": str(members[member]),
            **({"times": times[member].as_dict()} if member in times else {}),
            "tile_reads": {name: int(c[member]) for name, c in per_split.items()},
            "share": round(sum(c[member] for c in per_split.values()) / total, 4) if total else 0.0,
        }
        for member in members
    }
