"""How much a pass reads at once and ahead: the engine's sizing policy, which ``describe()`` reports too.

The engine sizes ``max_inflight="auto"`` and a remote pass's read-ahead with
these functions, and :mod:`insitubatch.plan.cost` states the same numbers
in ``describe()`` and ``insitubatch inspect``: one policy, computed from the
plan alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .epoch import EpochPlan

__all__ = [
    "AUTO_INFLIGHT_CEILING",
    "READ_AHEAD_SHARE",
    "auto_inflight_cap",
    "auto_read_ahead",
    "gets_per_read",
]

MIB = 1 << 20
# A pass holds at most its read-ahead bound of reads pinned, and about half of
# them are the block being gathered: so at most 1 / READ_AHEAD_SHARE of the
# window's GETs are in flight. (The pass stats judge a store-limited pass by
# the same share; measured on 30 ms emulated GETs, the windows of 24-32 GETs
# kept 12-20 in flight.)
READ_AHEAD_SHARE = 2


# max_inflight="auto" lets the engine raise the reads in flight while throughput still rises, up to a cap:
# as many decoded tiles as fit AUTO_INFLIGHT_BYTES, never more than AUTO_INFLIGHT_CEILING reads (each is a
# connection to the store) nor fewer than AUTO_INFLIGHT_FLOOR however fat the tiles.
AUTO_INFLIGHT_BYTES = 512 * MIB
AUTO_INFLIGHT_CEILING = 256
AUTO_INFLIGHT_FLOOR = 4


def auto_inflight_cap(tile_bytes: int) -> int:
    """The most reads ``max_inflight="auto"`` holds at once for decoded tiles of ``tile_bytes``."""
    return max(AUTO_INFLIGHT_FLOOR, min(AUTO_INFLIGHT_CEILING, AUTO_INFLIGHT_BYTES // max(int(tile_bytes), 1)))


def auto_read_ahead(plan: EpochPlan, tiles_per_read: Mapping[str, int], cap: int) -> tuple[int, int]:
    """``(bytes, reads)`` a remote pass under ``max_inflight="auto"`` may read ahead beyond its working set.

    The plan reads one shuffle block ahead, which can hold fewer tiles than
    the window may want in flight: a pass may then read further ahead, as
    many reads as bring the tiles ahead up to ``cap``, so the window can
    fill while the consumer works on the current block. Where a block
    already holds ``cap`` tiles, nothing more: memory read ahead past what
    the window can use is memory the link does not need. Their decoded bytes
    are a term of the memory plan.
    """
    if not plan.reads:
        return 0, 0
    per_read = sum(tiles_per_read[source] for source, _ in plan.reads) / len(plan.reads)
    # the tiles one block ahead holds: the smallest full block (a last, partial block is read with less ahead)
    sizes = [len(block) for block in plan.block_reads]
    full = sizes[:-1] if len(sizes) > 1 else sizes
    ahead_tiles = min(full) * per_read
    reads = math.ceil(max(0.0, cap - ahead_tiles) / per_read)
    return reads * int(plan.read_nbytes.max()), reads


def gets_per_read(plan: EpochPlan, tiles_per_read: Mapping[str, int]) -> float:
    """The GETs one of ``plan``'s reads costs on average (a chunk split into tiles costs one per tile)."""
    return sum(tiles_per_read[source] for source, _ in plan.reads) / len(plan.reads) if plan.reads else 1.0
