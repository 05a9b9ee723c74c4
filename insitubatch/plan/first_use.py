"""Which reads a pass's first batches need first: the order a remote pass sends them in."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .epoch import EpochPlan

__all__ = ["admission_order", "block_order"]


def admission_order(plan: EpochPlan, first_block: int) -> list[int]:
    """The reads a pass from ``first_block`` admits, in the order it admits them.

    By block; the reads ``first_block`` holds (its own, and on a resumed
    pass those it shares with earlier blocks) by the first of its rows
    each serves (:func:`block_order`), so the first batch's go out first;
    later blocks' in plan order. Reads only earlier blocks use are left out.
    """
    order = np.argsort(plan.read_first, kind="stable")
    order = order[plan.read_last[order] >= first_block]
    n = int(np.searchsorted(plan.read_first[order], first_block, side="right"))
    return block_order(plan, first_block, order[:n].tolist()) + order[n:].tolist()


def block_order(plan: EpochPlan, block: int, reads: Sequence[int] | None = None) -> list[int]:
    """``reads`` (by default those first used by ``block``) by the first of ``block``'s rows each serves.

    A remote pass sends its first block's GETs at once, and a server
    answers them about in the order they came; in plan order (by array
    and chunk) the first batch would wait for most of the block. Reads
    of one stored chunk stay side by side, in plan order, placed by the
    earliest of them: an array chunk's selections share tile reads, and a
    shard's adjacent inner chunks are read in one GET when they go out
    together. Reads no row of the block uses (admitted early with a
    sibling, or held over it) follow in plan order.
    """
    mine = sorted(int(i) for i in (np.flatnonzero(plan.read_first == block) if reads is None else reads))
    if plan.source_reads is None or not mine:
        return mine
    lo, hi = int(plan.block_starts[block]), int(plan.block_starts[block + 1])
    anchors = plan.anchors[lo:hi]
    first_row: dict[tuple[str, int], int] = {}
    for source, (_, size, offsets, _) in plan.source_reads.items():
        for off in offsets:
            chunks, rows = np.unique((anchors + off) // size, return_index=True)
            for chunk, row in zip(chunks.tolist(), rows.tolist()):
                if first_row.get((source, chunk), hi - lo) > row:
                    first_row[(source, chunk)] = row
    sources = plan.source_reads
    group_rank: dict[tuple[str, int], tuple[int, int]] = {}  # a stored chunk's: (earliest row, first in plan order)
    groups = []
    for k, i in enumerate(mine):
        source, chunk = plan.reads[i]
        group = (sources[source][0], chunk // sources[source][3])
        row = first_row.get((source, chunk), hi - lo)
        rank = group_rank.get(group)
        group_rank[group] = (row, k) if rank is None else (min(rank[0], row), rank[1])
        groups.append(group)
    return [mine[k] for k in sorted(range(len(mine)), key=lambda k: (*group_rank[groups[k]], k))]
