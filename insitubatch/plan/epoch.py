"""The planner: an epoch's sample order and its deduplicated read plan.

Pure numpy, O(chunks) Python work. An epoch is a seeded permutation of the
split's chunks, cut into shuffle blocks of ``block_chunks`` chunks whose
samples are shuffled together; batches are cut over the whole order. Each
block's reads are deduplicated per array path, so aliased labels (windows of
one array) decode once. The plan also derives the memory floor
(``working_set_bytes``) and the read-ahead bound; neither is configured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.random import default_rng  # at import: numpy loads its random module on first use (~8 ms)

from ..io.geometry import ArrayGeometry
from ..validation import Anything, Interval, Table, validate_params
from .anchors import rows_kept, valid_anchor_range
from .quarantine import drop_quarantined
from .splits import SplitManifest

__all__ = [
    "EpochOrder",
    "EpochPlan",
    "ReadKey",
    "build_plan",
    "epoch_order",
    "plan_epoch",
    "shuffle_quality",
    "sorted_unique",
    "valid_anchor_range",
]

ReadKey = tuple[str, int]
"""``(source, sample-axis chunk index)``: one residency unit (what a chunk keeps of its tiles).

The source is ``ArrayGeometry.source``: the array path, plus the selection when there is one.
"""


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a 1-D integer array, without the ``numpy.ma`` import (~20 ms) numpy's first call makes."""
    ordered = np.sort(values)
    keep = np.ones(ordered.size, dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of one split: the sample ledger, blocks, batches and reads.

    ``order`` is the ``(N, 2)`` ledger ``[chunk_id, within]`` on the manifest's
    anchor grid; anchor = ``chunk_id * sample_chunk_size + within``.
    """

    order: np.ndarray
    anchors: np.ndarray
    block_starts: np.ndarray  # (n_blocks + 1,) row offsets of each block in ``order``
    batch_size: int
    reads: tuple[ReadKey, ...]  # in the order the driver admits them
    read_first: np.ndarray  # first block that reads each read
    read_last: np.ndarray  # last block that reads each read
    read_nbytes: np.ndarray
    block_reads: tuple[tuple[int, ...], ...]  # per block: indices into ``reads``
    working_set_bytes: int
    read_ahead_bound: int
    padded: np.ndarray | None = None  # rows repeated to even out ranks (distributed "pad" policy)
    # per source: its array path, sample chunk size, the offsets its labels read at (a row to its chunks),
    # and its read chunks per stored chunk along the sample axis (a sharded array's inner chunks per shard)
    source_reads: Mapping[str, tuple[str, int, tuple[int, ...], int]] | None = None

    @property
    def n_samples(self) -> int:
        return len(self.order)

    @property
    def n_blocks(self) -> int:
        return len(self.block_starts) - 1

    @property
    def n_batches(self) -> int:
        return -(-self.n_samples // self.batch_size)

    def batch_rows(self, k: int) -> tuple[int, int]:
        """Half-open row range of batch ``k`` in ``order``."""
        start = k * self.batch_size
        return start, min(start + self.batch_size, self.n_samples)

    def batch_blocks(self, k: int) -> tuple[int, int]:
        """First and last block (inclusive) batch ``k`` draws from."""
        start, stop = self.batch_rows(k)
        b0 = int(np.searchsorted(self.block_starts, start, side="right")) - 1
        b1 = int(np.searchsorted(self.block_starts, stop - 1, side="right")) - 1
        return b0, b1


@dataclass(frozen=True)
class EpochOrder:
    """The world-size-independent order of an epoch: the ledger and its shuffle blocks."""

    order: np.ndarray  # (N, 2) [chunk_id, within]
    block_starts: np.ndarray  # (n_blocks + 1,)


def _chunk_rows(chunks: np.ndarray, manifest: SplitManifest, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The ledger rows ``[chunk_id, within]`` of ``chunks``, in order, for anchors in ``[lo, hi)``; each chunk's count."""
    S = manifest.sample_chunk_size
    base = chunks * S
    w0 = np.maximum(0, lo - base)
    w1 = np.minimum(np.minimum(S, manifest.n_samples - base), hi - base)
    counts = np.maximum(0, w1 - w0)
    first_row = np.cumsum(counts) - counts  # each chunk's first row in the ledger
    within = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(w0 - first_row, counts)
    return np.stack([np.repeat(chunks, counts), within], axis=1), counts


def epoch_order(
    manifest: SplitManifest,
    split: str,
    variables: Mapping[str, ArrayGeometry],
    *,
    block_chunks: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    anchor_range: tuple[int, int] | None = None,
    blocks: int | None = None,
    keep: np.ndarray | None = None,
) -> EpochOrder:
    """The global sample order of one epoch; depends on (seed, epoch) only.

    Every valid anchor of the split appears exactly once; anchors whose window
    (``anchor + offset`` for some label) would read off its array are dropped,
    and so is a block left without any (it would plan no sample, only reads).
    ``anchor_range`` further restricts anchors to ``[start, stop)``, as does
    the split's own range in the manifest (a split cut at exact dates); one reading a quarantined chunk is dropped.
    ``blocks`` stops after that many blocks: the same first blocks, sooner. ``keep`` (per anchor,
    ``anchors.AnchorRules``) drops anchors whose times are not stored, declared missing, off the frequency.
    """
    lo, hi = valid_anchor_range(manifest, variables)
    for bounds in (anchor_range, manifest.split_range(split)):
        if bounds is not None:
            lo, hi = max(lo, int(bounds[0])), min(hi, int(bounds[1]))
    rng = default_rng([int(seed), int(epoch)])
    chunks = np.asarray(manifest.chunks(split), dtype=np.int64)
    if shuffle:
        chunks = rng.permutation(chunks)
    if blocks is not None:  # the first blocks need no more chunks than the first non-empty ones hold
        chunks = _head_chunks(chunks, manifest, lo, hi, block_chunks, blocks, keep)
    rows, counts = drop_quarantined(*_chunk_rows(chunks, manifest, lo, hi), manifest, variables)
    rows, counts = rows_kept(rows, counts, keep, manifest.sample_chunk_size)
    sizes = np.add.reduceat(counts, np.arange(0, len(counts), block_chunks)) if len(counts) else counts
    # a block whose anchors all lie off a window's edge is no block: no reads, no memory
    sizes = sizes[sizes > 0][:blocks]
    block_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = rows[: block_starts[-1]]
    if shuffle:  # each block's rows shuffled together, in block order (the generator's draws in that order)
        shuffled = [start + rng.permutation(n) for start, n in zip(block_starts[:-1].tolist(), sizes.tolist())]
        rows = rows[np.concatenate(shuffled)] if shuffled else rows
    return EpochOrder(rows, block_starts)


def _head_chunks(
    chunks: np.ndarray,
    manifest: SplitManifest,
    lo: int,
    hi: int,
    block_chunks: int,
    blocks: int,
    keep: np.ndarray | None,
) -> np.ndarray:
    """The shortest prefix of ``chunks`` (whole blocks) that holds ``blocks`` blocks with rows."""
    stop, found = 0, 0
    while found < blocks and stop < len(chunks):
        block = chunks[stop : stop + block_chunks]
        stop += len(block)
        found += bool(rows_kept(*_chunk_rows(block, manifest, lo, hi), keep, manifest.sample_chunk_size)[1].any())
    return chunks[:stop]


def plan_epoch(
    manifest: SplitManifest,
    split: str,
    variables: Mapping[str, ArrayGeometry],
    *,
    batch_size: int,
    block_chunks: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    anchor_range: tuple[int, int] | None = None,
) -> EpochPlan:
    """Plan one epoch of ``split`` for a single process: order, blocks, batches, reads."""
    eo = epoch_order(
        manifest,
        split,
        variables,
        block_chunks=block_chunks,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        anchor_range=anchor_range,
    )
    return build_plan(manifest, variables, eo.order, eo.block_starts, batch_size)


def build_plan(
    manifest: SplitManifest,
    variables: Mapping[str, ArrayGeometry],
    order: np.ndarray,
    block_starts: np.ndarray,
    batch_size: int,
    *,
    padded: np.ndarray | None = None,
    release_per_block: bool = False,
) -> EpochPlan:
    """An ``EpochPlan`` over a given ledger and block layout: the reads deduplicated per block.

    ``padded`` marks rows that repeat an earlier sample to even out ranks.
    ``release_per_block`` gives every block its own reads, so a chunk used by
    two distant blocks (a windowed label) is released in between and
    re-admitted later, from the disk cache, instead of pinned throughout.
    """
    S = manifest.sample_chunk_size
    anchors = order[:, 0] * S + order[:, 1]
    block_starts = np.asarray(block_starts, dtype=np.int64)
    sources: dict[str, ArrayGeometry] = {}  # labels with one source (path and selection) share its reads
    for g in variables.values():
        sources.setdefault(g.source, g)
    fixed = [v for v in variables.values() if v.time_rows is None]  # the others read by rows (``timed``)
    read_offsets = {
        source: sorted({off for v in fixed if v.source == source for off in v.read_offsets}) for source in sources
    }
    timed = {s: [v.read_rows(anchors) for v in variables.values() if v.source == s and v.time_rows] for s in sources}
    paths = {path: k for k, path in enumerate(dict.fromkeys(g.path for g in sources.values()))}
    reads, first, last, nbytes, block_reads = _block_reads(
        sources, read_offsets, timed, paths, anchors, block_starts, release_per_block
    )
    if not release_per_block and len(sources) > len(paths):
        reads, first, last, nbytes, block_reads = _read_chunks_together(
            reads, first, last, nbytes, block_reads, {s: (paths[g.path], k) for k, (s, g) in enumerate(sources.items())}
        )
    plan = EpochPlan(
        order=order,
        anchors=anchors,
        block_starts=block_starts,
        batch_size=int(batch_size),
        reads=tuple(reads),
        read_first=np.asarray(first, dtype=np.int64),
        read_last=np.asarray(last, dtype=np.int64),
        read_nbytes=np.asarray(nbytes, dtype=np.int64),
        block_reads=tuple(block_reads),
        working_set_bytes=0,
        read_ahead_bound=0,
        padded=padded,
        source_reads={
            name: (g.path, g.sample_chunk_size, tuple(read_offsets[name]), g.reads_per_stored_chunk)
            for name, g in sources.items()
        },
    )
    ws, bound = _peak_live(plan)
    object.__setattr__(plan, "working_set_bytes", ws)
    object.__setattr__(plan, "read_ahead_bound", bound)
    return plan


def _block_reads(
    sources: Mapping[str, ArrayGeometry],
    read_offsets: Mapping[str, list[int]],
    timed: Mapping[str, list[np.ndarray]],
    paths: Mapping[str, int],
    anchors: np.ndarray,
    block_starts: np.ndarray,
    release_per_block: bool,
) -> tuple[list[ReadKey], list[int], list[int], list[int], list[tuple[int, ...]]]:
    """Each block's reads, deduplicated: ``(reads, first block, last block, bytes, per block its read indices)``.

    A block wants, per source, the chunks its anchors (at every read
    offset, and at each row of a label offset in time: ``timed``) fall in,
    ordered by (array, chunk, source) so selections of one array take its
    chunks side by side. A read serves every block from the first that
    wants its chunk on (with ``release_per_block``, only an unbroken run of
    blocks: a gap starts a new read); reads are numbered in the order
    blocks first want them. Array operations throughout: an
    epoch of a long archive has millions of reads.
    """
    n_blocks = len(block_starts) - 1
    block_of_row = np.repeat(np.arange(n_blocks, dtype=np.int64), np.diff(block_starts))
    columns: list[list[np.ndarray]] = [[], [], [], []]  # block, array, chunk, source: one entry per (block, read)
    for s, (name, g) in enumerate(sources.items()):
        size, n_chunks = g.sample_chunk_size, max(1, g.n_chunks)
        at = [anchors + off for off in read_offsets[name]] + [r[:, j] for r in timed[name] for j in range(r.shape[1])]
        chunks = np.concatenate(at) // size
        outside = (chunks < 0) | (chunks >= g.n_chunks)
        if outside.any():
            g.chunk_len(int(chunks[outside][0]))  # raises: names the chunk, the array and the valid range
        wanted = sorted_unique(np.tile(block_of_row, len(at)) * n_chunks + chunks)
        columns[0].append(wanted // n_chunks)
        columns[1].append(np.full(wanted.shape, paths[g.path], dtype=np.int64))
        columns[2].append(wanted % n_chunks)
        columns[3].append(np.full(wanted.shape, s, dtype=np.int64))
    block, array, chunk, source = (np.concatenate(c) if c else np.empty(0, np.int64) for c in columns)
    spans = (max(1, len(paths)), int(chunk.max(initial=0)) + 1, len(sources))
    stream = _sort_order((block, array, chunk, source), (n_blocks, *spans))  # by block, then array, chunk, source
    block, chunk, source = block[stream], chunk[stream], source[stream]
    # runs: a (source, chunk)'s blocks in order; a new run where the key changes or (released) a block is skipped
    key = source * spans[1] + chunk
    by_key = _sort_order((key, block), (len(sources) * spans[1], n_blocks))
    k, b = key[by_key], block[by_key]
    new_run = np.ones(len(k), dtype=bool)
    np.not_equal(k[1:], k[:-1], out=new_run[1:])
    if release_per_block:
        new_run[1:] |= b[1:] - b[:-1] > 1
    run_starts = np.flatnonzero(new_run)
    run_of = np.empty(len(k), dtype=np.int64)
    run_of[by_key] = np.cumsum(new_run) - 1
    read_of_run = np.empty(len(run_starts), dtype=np.int64)  # numbered by the run's first entry in the stream
    read_of_run[np.argsort(by_key[run_starts], kind="stable")] = np.arange(len(run_starts))
    read_of = read_of_run[run_of]
    first_of = np.empty(len(run_starts), dtype=np.int64)
    last_of = np.empty(len(run_starts), dtype=np.int64)
    first_of[read_of_run] = b[run_starts]
    last_of[read_of_run] = b[np.append(run_starts[1:], len(k))[: len(run_starts)] - 1]
    head = np.empty(len(run_starts), dtype=np.int64)  # each read's first entry in the stream
    head[read_of_run] = by_key[run_starts]
    read_source, read_chunk = source[head], chunk[head]
    nbytes = np.zeros(len(head), dtype=np.int64)
    for s, g in enumerate(sources.values()):
        mine = read_source == s
        size = g.sample_chunk_size
        nbytes[mine] = np.minimum(size, g.n_samples - read_chunk[mine] * size) * g.sample_nbytes
    names = np.empty(len(sources), dtype=object)
    names[:] = list(sources)
    reads = list(zip(names[read_source].tolist(), read_chunk.tolist()))
    cuts = np.cumsum(np.bincount(block, minlength=n_blocks))[:-1]
    block_reads = [tuple(part.tolist()) for part in np.split(read_of, cuts)] if n_blocks else []
    return reads, first_of.tolist(), last_of.tolist(), nbytes.tolist(), block_reads


def _sort_order(keys: tuple[np.ndarray, ...], spans: tuple[int, ...]) -> np.ndarray:
    """The order sorting by ``keys`` (most significant first; each in ``[0, span)``): one int64 sort when they fit."""
    if math.prod(spans) < 2**62:
        packed = np.zeros(len(keys[0]), dtype=np.int64)
        for key, span in zip(keys, spans):
            packed *= span
            packed += key
        return np.argsort(packed, kind="stable")
    return np.lexsort(keys[::-1])


def _read_chunks_together(
    reads: list[ReadKey],
    first: list[int],
    last: list[int],
    nbytes: list[int],
    block_reads: list[tuple[int, ...]],
    rank: Mapping[str, tuple[int, int]],
) -> tuple[list[ReadKey], list[int], list[int], list[int], list[tuple[int, ...]]]:
    """Admit every selection's read of one array chunk with the first of them, side by side.

    Two selections of one array (``t[level=850]`` and ``t[level=[850, 500]]``)
    are two sources with reads of their own, and a shift can make one need a
    chunk blocks before the other. Admitted together, adjacent in admission
    order, they share one read of each stored tile (``Want``); the later one
    is then resident from the earlier block on, which the working set counts.
    ``rank`` orders sources: ``(array index, source index)``.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (source, chunk) in enumerate(reads):
        groups.setdefault((rank[source][0], chunk), []).append(i)
    first = list(first)
    for members in groups.values():
        start = min(first[i] for i in members)
        for i in members:
            first[i] = start
    order = sorted(range(len(reads)), key=lambda i: (first[i], rank[reads[i][0]][0], reads[i][1], rank[reads[i][0]][1]))
    new_index = {old: new for new, old in enumerate(order)}
    return (
        [reads[i] for i in order],
        [first[i] for i in order],
        [last[i] for i in order],
        [nbytes[i] for i in order],
        [tuple(new_index[i] for i in mine) for mine in block_reads],
    )


def _peak_live(plan: EpochPlan) -> tuple[int, int]:
    """Peak bytes and count of reads that must be resident at once.

    While batch ``k`` (drawing from blocks ``b0..b1``) is gathered, every read
    still live at ``b0`` (last use >= b0) that started by ``b1`` is pinned, and
    the driver may already be admitting block ``b1 + 1``. The peak over
    batches of that set is the floor below which a pass deadlocks against its
    own limit.
    """
    if not plan.reads or plan.n_samples == 0:
        return 0, 0
    k = np.arange(plan.n_batches)
    starts = k * plan.batch_size
    stops = np.minimum(starts + plan.batch_size, plan.n_samples) - 1
    b0 = np.searchsorted(plan.block_starts, starts, side="right") - 1
    b1 = np.searchsorted(plan.block_starts, stops, side="right") - 1 + 1  # include the read-ahead block

    def excluded(values: np.ndarray, weights: np.ndarray, bounds: np.ndarray, below: bool) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        v, cw = values[order], np.concatenate([[0], np.cumsum(weights[order])])
        if below:  # sum of weights with value < bound
            return cw[np.searchsorted(v, bounds, side="left")]
        return cw[-1] - cw[np.searchsorted(v, bounds, side="right")]  # value > bound

    ones = np.ones(len(plan.reads), dtype=np.int64)
    total_b, total_n = int(plan.read_nbytes.sum()), len(plan.reads)
    live_b = (
        total_b
        - excluded(plan.read_last, plan.read_nbytes, b0, True)
        - excluded(plan.read_first, plan.read_nbytes, b1, False)
    )
    live_n = total_n - excluded(plan.read_last, ones, b0, True) - excluded(plan.read_first, ones, b1, False)
    return int(live_b.max()), int(live_n.max())


# What ``shuffle_quality`` accepts (``validation``)
QUALITY_PARAMETERS: Table = {
    "order": [Anything("np.asarray: a (N, 2) ledger or 1-D sample indices")],
    "samples_per_chunk": [Interval(1)],
}


@validate_params(QUALITY_PARAMETERS)
def shuffle_quality(order: np.ndarray, samples_per_chunk: int) -> float:
    """How close an emitted order is to a perfect global shuffle, in ``[0, 1]``.

    ``order`` is either the ``(N, 2)`` ledger or a 1-D array of sample
    indices. Two scores, each normalised so a uniform random permutation
    scores ~1 and sequential order 0, combined by geometric mean:
    adjacent draws from different chunks, and how far samples move from
    their sorted position.
    """
    order = np.asarray(order)
    samples = order[:, 0] * samples_per_chunk + order[:, 1] if order.ndim == 2 else order.astype(np.int64)
    n = len(samples)
    if n < 3:
        return 1.0
    chunk = samples // samples_per_chunk
    counts = np.bincount(chunk - chunk.min())
    same_global = float((counts * (counts - 1)).sum()) / (n * (n - 1))
    same_obs = float(np.mean(chunk[1:] == chunk[:-1]))
    mixing = (1.0 - same_obs) / (1.0 - same_global) if same_global < 1.0 else 1.0
    rank = np.argsort(np.argsort(samples, kind="stable"), kind="stable")
    displacement = float(np.mean(np.abs(rank - np.arange(n))))
    expected = (n * n - 1) / (3.0 * n)  # E|i - pi(i)| for a uniform permutation
    moved = displacement / expected
    return float(np.sqrt(np.clip(mixing, 0.0, 1.0) * np.clip(moved, 0.0, 1.0)))
