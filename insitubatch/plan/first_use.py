"""Which of a block's reads its first batches need first: the order a remote pass sends them in."""

from __future__ import annotations

import numpy as np

from .epoch import EpochPlan

__all__ = ["block_order"]


def block_order(plan: EpochPlan, block: int) -> list[int]:
    """The reads first admitted for ``block``, by the first of its rows each serves: the first batch's first.

    A remote pass sends its first block's GETs at once, and a server
    answers them about in the order they came; in plan order (by array
    and chunk) the first batch would wait for most of the block. Reads
    of one stored chunk stay side by side, in plan order, placed by the
    earliest of them: an array chunk's selections share tile reads, and a
    shard's adjacent inner chunks are read in one GET when they go out
    together. Reads no row of the block uses (admitted early with a
    sibling) follow in plan order.
    """
    mine = [int(i) for i in np.flatnonzero(plan.read_first == block)]
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
    rank = [first_row.get(plan.reads[i], hi - lo) for i in mine]
    sources = plan.source_reads
    chunk = [(sources[plan.reads[i][0]][0], plan.reads[i][1] // sources[plan.reads[i][0]][3]) for i in mine]
    for k in range(len(mine) - 1, 0, -1):  # a run of one stored chunk's reads takes the run's minimum
        if chunk[k] == chunk[k - 1]:
            rank[k - 1] = min(rank[k - 1], rank[k])
    for k in range(1, len(mine)):
        if chunk[k] == chunk[k - 1]:
            rank[k] = rank[k - 1]
    return [mine[k] for k in sorted(range(len(mine)), key=rank.__getitem__)]
