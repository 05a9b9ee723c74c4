"""Sharding an epoch across ranks: chunk-aligned, equal batch counts, elastic resume.

The global order of an epoch (``plan.epoch_order``) depends on (seed, epoch)
only. Ranks split it without talking to each other:

* training passes cut the epoch's sequence of shuffled blocks into
  ``world_size`` consecutive runs of near-equal sample counts, at chunk
  boundaries: every chunk is read by exactly one rank, ranks' sample counts
  differ by at most one chunk, and each rank's batches are drawn from whole
  shuffled blocks (a block straddling a cut gives each side its own chunks,
  in the block's shuffled order). The blocks are a random permutation of the
  chunks, so a run of them is as well mixed as any other choice of blocks;
* evaluation and inference passes cut the sequential order into
  ``world_size`` contiguous, chunk-aligned ranges and are exactly complete
  when gathered (batch counts may differ by one or two).

A training pass must give every rank the same number of batches or DDP
hangs, and a rank's stream rarely fills its last batch. ``last_batch``
says what happens to that end (DALI's last-batch policies), on one rank
and on several alike, every rank ending with the same batch count:

* ``"pad"``: every batch is full. Each rank's stream is topped up to the
  longest rank's batch count times ``batch_size`` by repeating that rank's
  own samples, marked ``True`` in ``batch.extras["padded"]`` (a mask a loss
  can weight by);
* ``"drop"``: every batch is full. Every rank is cut to the shortest rank's
  count of full batches; the samples past it are not seen this epoch;
* ``"partial"``: every sample is seen once and each rank's last batch may be
  short. Where the chunk-aligned cut leaves ranks with different batch
  counts, samples from the ends of the longer ranks move to the shorter
  ones (their chunks are then read by two ranks). Only when fewer samples
  remain for the last batches than there are ranks does a rank repeat
  some of its own (marked as under ``"pad"``) to keep the counts equal.

``None`` (the dataset's default) is ``"pad"`` on several ranks and
``"partial"`` on one: the behaviour before ``last_batch`` existed. Counts
being within one chunk, pad and drop touch less than one chunk plus one
batch per rank, like ``DistributedSampler``'s one round. ``len(view)``
reports the result. Evaluation passes are exactly complete instead (each
sample once, last batches short, counts may differ by one or two).

Elastic resume: a checkpoint records the world size and the batches every
rank consumed (all ranks consume in lockstep). Resuming at another world
size replays that history to find the consumed samples, then deals the
remaining ones (the tails of partly consumed blocks, then whole blocks) to
the new ranks, cut the same way: no sample is seen twice and none is skipped.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from ..validation import positive_int
from .epoch import EpochOrder, sorted_unique

__all__ = [
    "LAST_BATCH_POLICIES",
    "LastBatch",
    "REMAINDER_POLICIES",
    "RankStream",
    "Remainder",
    "last_batch_policy",
    "rank_streams",
    "resolve_last_batch",
    "resolve_world",
]

LastBatch = Literal["pad", "drop", "partial"]
LAST_BATCH_POLICIES: tuple[LastBatch, ...] = get_args(LastBatch)
# the deprecated ``remainder=`` of the dataset: how several ranks were evened out before ``last_batch``
Remainder = Literal["pad", "drop"]
REMAINDER_POLICIES: tuple[Remainder, ...] = get_args(Remainder)


def resolve_last_batch(last_batch: LastBatch | None, world_size: int) -> LastBatch:
    """The policy in force at ``world_size``: ``None`` is ``"pad"`` on several ranks, ``"partial"`` on one."""
    if last_batch is None:
        return "pad" if world_size > 1 else "partial"
    if last_batch not in LAST_BATCH_POLICIES:
        raise ValueError(f"last_batch={last_batch!r} must be one of {LAST_BATCH_POLICIES} (or None)")
    return last_batch


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit values, else torch.distributed, else JAX's processes, else ``RANK``/``WORLD_SIZE``, else 0/1.

    JAX's are ``jax.process_index()``/``jax.process_count()``, taken once
    ``jax.distributed.initialize`` ran: asking JAX any earlier would start its
    backends, after which the job could no longer initialise.
    """
    if rank is None and world_size is None and "torch" in sys.modules:
        # a process group can only exist if torch was imported: never pay for importing it here
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank is None and world_size is None and "jax" in sys.modules:
        import jax

        initialized = getattr(jax.distributed, "is_initialized", None)  # JAX 0.4.3x and later
        if initialized is not None and initialized():
            rank, world_size = jax.process_index(), jax.process_count()
    if rank is None and world_size is None and "WORLD_SIZE" in os.environ:
        try:
            rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
        except ValueError as exc:
            raise ValueError(
                f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} must be integers"
            ) from exc
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    # explicit values passed the dataset's door; those read from torch, JAX or the environment are ints
    world_size = positive_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"{rank=} must be in [0, world_size={world_size})")
    return int(rank), int(world_size)


def last_batch_policy(last_batch: LastBatch | None, remainder: Remainder | None) -> LastBatch | None:
    """The dataset's ``last_batch``, or what its deprecated ``remainder`` stands for (both given must agree).

    ``remainder="pad"`` was the default (``None``); ``remainder="drop"`` is
    ``last_batch="drop"``, which drops a single rank's short batch as well.
    """
    if remainder is None:
        return last_batch
    if remainder not in REMAINDER_POLICIES:
        raise ValueError(
            f"remainder={remainder!r} must be one of {REMAINDER_POLICIES}; it is deprecated: use last_batch"
        )
    warnings.warn(
        f"remainder={remainder!r} is deprecated: use last_batch={remainder!r} (or leave it unset for the default, "
        "pad on several ranks and a short last batch on one)",
        DeprecationWarning,
        stacklevel=3,
    )
    alias: LastBatch | None = "drop" if remainder == "drop" else None
    if last_batch is not None and last_batch != (alias or "pad"):
        raise ValueError(f"remainder={remainder!r} contradicts last_batch={last_batch!r}: give last_batch alone")
    return last_batch if last_batch is not None else alias


class RankStream:
    """One rank's rows of the epoch order, with the block boundaries of its stream."""

    def __init__(self, rows: np.ndarray, block_starts: np.ndarray, padded: np.ndarray | None = None) -> None:
        self.rows = rows
        self.block_starts = block_starts
        self.padded = padded if padded is not None else np.zeros(len(rows), dtype=bool)


def _pieces(eo: EpochOrder, consumed: np.ndarray) -> list[np.ndarray]:
    """Each block's unconsumed rows (indices into ``eo.order``), in block order, non-empty only."""
    out = []
    for b in range(len(eo.block_starts) - 1):
        rows = np.arange(eo.block_starts[b], eo.block_starts[b + 1])
        rows = rows[~consumed[rows]]
        if len(rows):
            out.append(rows)
    return out


def _stream(pieces: Sequence[np.ndarray]) -> RankStream:
    rows = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    starts = np.cumsum([0, *[len(p) for p in pieces]]).astype(np.int64)
    return RankStream(rows, starts)


def _contiguous(eo: EpochOrder, pieces: list[np.ndarray], world_size: int) -> list[RankStream]:
    """Cut the remaining sequential rows into ranges of near-equal size at chunk boundaries."""
    rows = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    block_of = np.searchsorted(eo.block_starts, rows, side="right") - 1
    chunk = eo.order[rows, 0] if len(rows) else np.empty(0, dtype=np.int64)
    change = np.flatnonzero(np.diff(chunk)) + 1 if len(rows) else np.empty(0, dtype=np.int64)
    cuts = np.concatenate([[0], change, [len(rows)]])  # candidate boundaries: chunk starts
    streams = []
    prev = 0
    for r in range(world_size):
        target = round(len(rows) * (r + 1) / world_size)
        stop = int(cuts[np.argmin(np.abs(cuts - target))]) if r < world_size - 1 else len(rows)
        stop = max(stop, prev)
        mine = rows[prev:stop]
        blocks = block_of[prev:stop]
        bounds = np.flatnonzero(np.diff(blocks)) + 1 if len(mine) else np.empty(0, dtype=np.int64)
        streams.append(RankStream(mine, np.concatenate([[0], bounds, [len(mine)]]).astype(np.int64)))
        prev = stop
    return streams


def _chunk_runs(eo: EpochOrder, pieces: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The units a training cut may fall between: each piece's chunks in order of first appearance.

    Returns each unit's piece index and sample count, and each piece's chunk ids in that order.
    """
    unit_piece, unit_size, piece_chunks = [], [], []
    for p, rows in enumerate(pieces):
        ids, first, counts = np.unique(eo.order[rows, 0], return_index=True, return_counts=True)
        by_first = np.argsort(first, kind="stable")
        piece_chunks.append(ids[by_first])
        unit_piece.append(np.full(len(ids), p, dtype=np.int64))
        unit_size.append(counts[by_first])
    if not pieces:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), []
    return np.concatenate(unit_piece), np.concatenate(unit_size).astype(np.int64), piece_chunks


def _cuts(sizes: np.ndarray, world_size: int) -> np.ndarray:
    """Unit boundaries splitting ``sizes`` into ``world_size`` consecutive runs whose sums differ by at most
    the largest unit.

    Runs must each hold between ``low`` and ``low + largest`` samples. The
    positions a run can end at form a contiguous range of boundaries (no
    unit is larger than the window), so one forward sweep per candidate
    ``low`` (from the even share down) finds a feasible one, and a backward
    sweep picks the cuts.
    """
    prefix = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total, width = int(prefix[-1]), int(sizes.max()) if len(sizes) else 0
    for low in range(total // world_size, max(total // world_size - width, 0) - 1, -1):
        ranges = [(0, 0)]  # boundaries where run j can end: prefix indices [lo, hi]
        for _ in range(world_size - 1):
            lo, hi = ranges[-1]
            new_lo = int(np.searchsorted(prefix, prefix[lo] + low, side="left"))
            new_hi = int(np.searchsorted(prefix, prefix[hi] + low + width, side="right")) - 1
            if new_lo > new_hi:
                break
            ranges.append((new_lo, new_hi))
        else:
            lo, hi = ranges[-1]
            # the last run takes the rest: its start must leave between low and low + width
            first = max(lo, int(np.searchsorted(prefix, total - low - width, side="left")))
            last = min(hi, int(np.searchsorted(prefix, total - low, side="right")) - 1)
            if first > last:
                continue
            cuts = [len(sizes), last]
            for lo, hi in reversed(ranges[1:-1] if len(ranges) > 2 else []):
                end = prefix[cuts[-1]]
                # the latest boundary in this run's range that leaves the next run at least low
                j = min(hi, int(np.searchsorted(prefix, end - low, side="right")) - 1)
                cuts.append(max(j, lo))
            if world_size > 1:
                cuts.append(0)
            return np.asarray(cuts[::-1], dtype=np.int64)
    return _even_cuts(prefix, world_size)


def _even_cuts(prefix: np.ndarray, world_size: int) -> np.ndarray:
    """Fallback: each cut at the boundary nearest its even share of the total."""
    targets = prefix[-1] * np.arange(1, world_size) / world_size
    cuts = np.abs(prefix[None, :] - targets[:, None]).argmin(axis=1) if world_size > 1 else np.empty(0)
    return np.concatenate([[0], np.maximum.accumulate(cuts.astype(np.int64)), [len(prefix) - 1]]).astype(np.int64)


def _balanced(eo: EpochOrder, pieces: list[np.ndarray], world_size: int) -> list[RankStream]:
    """Cut the shuffled blocks into ``world_size`` runs whose sample counts differ by at most one chunk."""
    unit_piece, sizes, piece_chunks = _chunk_runs(eo, pieces)
    cuts = _cuts(sizes, world_size)
    piece_start = np.concatenate([[0], np.cumsum([len(c) for c in piece_chunks])]).astype(np.int64)
    streams = []
    for r in range(world_size):
        u0, u1 = int(cuts[r]), int(cuts[r + 1])
        mine = []
        for p in range(int(unit_piece[u0]), int(unit_piece[u1 - 1]) + 1) if u1 > u0 else ():
            rows = pieces[p]
            lo, hi = max(u0, int(piece_start[p])), min(u1, int(piece_start[p + 1]))
            if hi - lo < len(piece_chunks[p]):  # a block straddling a cut: this side's chunks
                chunks = piece_chunks[p][lo - piece_start[p] : hi - piece_start[p]]
                rows = rows[np.isin(eo.order[rows, 0], chunks)]
            mine.append(rows)
        streams.append(_stream(mine))
    return streams


def _cut(s: RankStream, n_rows: int) -> None:
    """Keep the first ``n_rows`` rows of ``s``."""
    s.rows, s.padded = s.rows[:n_rows], s.padded[:n_rows]
    starts = np.minimum(s.block_starts, n_rows)
    s.block_starts = sorted_unique(starts) if n_rows else np.zeros(1, dtype=np.int64)
    if s.block_starts[-1] != n_rows:
        s.block_starts = np.concatenate([s.block_starts, [n_rows]])


def _extend(s: RankStream, rows: np.ndarray, padded: bool) -> None:
    """Append ``rows`` to ``s`` as one more block (``padded`` marks them as repeats)."""
    if not len(rows):
        return
    s.padded = np.concatenate([s.padded, np.full(len(rows), padded)])
    s.rows = np.concatenate([s.rows, rows])
    s.block_starts = np.concatenate([s.block_starts, [len(s.rows)]]).astype(np.int64)


def _repeat_own(s: RankStream, n_rows: int, fallback: np.ndarray) -> None:
    """Top ``s`` up to ``n_rows`` rows by repeating its own (or, having none, the epoch's), marked padded."""
    source = s.rows if len(s.rows) else fallback
    if n_rows > len(s.rows) and len(source):
        _extend(s, np.resize(source, n_rows - len(s.rows)), padded=True)


def _partial(streams: list[RankStream], batch_size: int, fallback: np.ndarray) -> None:
    """Equal batch counts, every batch full but each rank's last, each sample once where the samples allow.

    With ``n`` the fewest batches that hold the epoch on every rank, a rank
    needs between ``lo = (n - 1) * batch_size + 1`` and ``hi = n * batch_size``
    rows. Rows past ``hi``, and where short ranks need more the rows past
    ``lo`` of the fullest ones, leave the ends of their streams and fill the
    short ranks to ``lo``, then any rank to ``hi``.
    """
    counts = np.array([len(s.rows) for s in streams], dtype=np.int64)
    total = int(counts.sum())
    if not total:
        return
    n = -(-total // (len(streams) * batch_size))
    lo, hi = (n - 1) * batch_size + 1, n * batch_size
    keep = np.minimum(counts, hi)
    wanted = int(np.maximum(lo - keep, 0).sum()) - int((counts - keep).sum())
    for r in np.argsort(-keep, kind="stable"):
        if wanted <= 0:
            break
        give = min(int(keep[r]) - lo, wanted)
        if give > 0:
            keep[r] -= give
            wanted -= give
    pool = np.concatenate([s.rows[int(k) :] for s, k in zip(streams, keep, strict=True)])
    for s, k in zip(streams, keep, strict=True):
        _cut(s, int(k))
    at = 0
    for cap in (lo, hi):
        for s in streams:
            take = min(max(cap - len(s.rows), 0), len(pool) - at)
            _extend(s, pool[at : at + take], padded=False)
            at += take
    for s in streams:  # fewer samples than ranks were left for the last batches
        _repeat_own(s, lo, fallback)


def _equalize(streams: list[RankStream], batch_size: int, last_batch: LastBatch, fallback: np.ndarray) -> None:
    """Give every rank the same number of batches under ``last_batch`` (the module's docstring)."""
    counts = [len(s.rows) for s in streams]
    if last_batch == "pad":
        n_rows = max(-(-c // batch_size) for c in counts) * batch_size
        for s in streams:
            _repeat_own(s, n_rows, fallback)
    elif last_batch == "drop":
        n_rows = min(c // batch_size for c in counts) * batch_size
        for s in streams:
            _cut(s, n_rows)
    else:
        _partial(streams, batch_size, fallback)


def rank_streams(
    eo: EpochOrder,
    world_size: int,
    *,
    batch_size: int,
    last_batch: LastBatch | None = None,
    contiguous: bool = False,
    history: Sequence[tuple[int, int]] = (),
) -> list[RankStream]:
    """Every rank's stream of an epoch after the consumed ``history`` of ``(world_size, batches)``.

    ``contiguous=True`` is the evaluation partition (exactly complete, no
    equalization); otherwise the blocks are cut into balanced runs at chunk
    boundaries and the batch counts evened out by ``last_batch``, resolved
    for each world size (``resolve_last_batch``: a history segment replays
    under the policy its world size had).
    """
    resolve_last_batch(last_batch, world_size)  # a bad policy raises before any work
    consumed = np.zeros(len(eo.order), dtype=bool)
    for w, k in history:
        policy = resolve_last_batch(last_batch, int(w))
        for s in _deal(eo, consumed, int(w), batch_size, policy, contiguous):
            consumed[s.rows[: int(k) * batch_size]] = True
    return _deal(eo, consumed, world_size, batch_size, resolve_last_batch(last_batch, world_size), contiguous)


def _deal(eo, consumed, world_size, batch_size, last_batch: LastBatch, contiguous) -> list[RankStream]:
    pieces = _pieces(eo, consumed)
    if contiguous:
        return _contiguous(eo, pieces, world_size)
    streams = [_stream(pieces)] if world_size == 1 else _balanced(eo, pieces, world_size)
    fallback = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    _equalize(streams, batch_size, last_batch, fallback)
    return streams
