"""Which GETs a shard's wanted inner chunks take, and how many GETs a pass will send.

A remote pass reads the inner chunks one block wants from one shard
together, after the shard's index: inner chunks that lie back to back in
the shard are one ranged GET (a *run*) of at most :func:`run_cap` of them.
Runs depend only on the plan, the knobs and the shard's layout, never on
timing, so :func:`pass_reads` predicts a cold pass's GETs exactly: one per
shard index the split does not hold yet (:func:`index_gets`), plus one per
run, plus one per tile of an unsharded array. Where an index has not been read yet, the
layout is zarr-python's: every inner chunk written, in Morton order, back
to back (``zarr.codecs.ShardingCodec`` writes shards that way). A local
store reads inner chunks one by one (a read there costs no round trip).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ...io.decode import make_decoder, shard_stage
from ...plan.epoch import EpochPlan
from ...plan.first_use import admission_order
from .reader import ArrayReader
from .shard_index import ShardIndex, held_index_bytes, plan_shards

__all__ = [
    "COALESCE_GAP_BYTES",
    "MAX_RUN_TILES",
    "admitted_reads",
    "coalesce",
    "index_gets",
    "morton_ranks",
    "pass_reads",
    "run_cap",
]

# Inner chunks of one shard read with one GET when the next starts at most this many bytes after the
# previous ends. 0: only back-to-back ones, so the bytes on the wire are exactly the inner chunks needed
# (a gap would be read and thrown away; on a link where a round trip costs more than that many bytes,
# raising it trades bytes for requests).
COALESCE_GAP_BYTES = 0
# The most inner chunks one GET reads: a run holds a read permit per tile, all at once, so a long one
# waits for that many to be free; 16 is half the window a remote pass starts with (``AUTO_START``).
MAX_RUN_TILES = 16

Span = TypeVar("Span", bound=tuple)


def run_cap(permit_cap: int) -> int:
    """Inner chunks per GET at most: ``MAX_RUN_TILES``, or fewer when a reader may hold fewer permits."""
    return max(1, min(MAX_RUN_TILES, int(permit_cap)))


def coalesce(spans: Sequence[Span], cap: int = MAX_RUN_TILES) -> list[list[Span]]:
    """``(start, stop, ...)`` byte spans of one shard as runs to read with one GET each.

    Sorted by offset; a span starting at most ``COALESCE_GAP_BYTES`` past
    the previous one's end joins its run, up to ``cap`` spans a run.
    """
    runs: list[list[Span]] = []
    for span in sorted(spans, key=lambda s: s[0]):
        last = runs[-1] if runs else None
        if last is not None and len(last) < cap and 0 <= span[0] - last[-1][1] <= COALESCE_GAP_BYTES:
            last.append(span)
        else:
            runs.append([span])
    return runs


@functools.lru_cache(maxsize=64)
def morton_ranks(chunks_per_shard: tuple[int, ...]) -> np.ndarray:
    """Each inner chunk's place in zarr-python's write order (Morton, the first axis's bit lowest), C-indexed.

    zarr interleaves the coordinate bits axis by axis from the lowest bit,
    an axis dropping out once its bits are used, and skips codes outside
    the grid: the rank is the code's position among the codes in the grid.
    """
    bits = [(n - 1).bit_length() for n in chunks_per_shard]
    coords = np.indices(chunks_per_shard).reshape(len(chunks_per_shard), -1)
    codes = np.zeros(coords.shape[1], dtype=np.int64)
    out_bit = 0
    for bit in range(max(bits, default=0)):
        for axis, width in enumerate(bits):
            if bit < width:
                codes |= ((coords[axis] >> bit) & 1).astype(np.int64) << out_bit
                out_bit += 1
    ranks = np.empty_like(codes)
    ranks[np.argsort(codes, kind="stable")] = np.arange(codes.size)
    return ranks.reshape(chunks_per_shard)


def admitted_reads(plan: EpochPlan, first_block: int, first_batch_first: bool) -> list[int]:
    """The reads a pass from ``first_block`` admits, in order: with ``first_batch_first`` (a remote pass without
    a disk cache) its first block's by its first batch's needs (``plan.first_use.admission_order``), else by
    block in plan order."""
    if first_batch_first:
        return admission_order(plan, first_block)
    order = np.argsort(plan.read_first, kind="stable").tolist()
    return [i for i in order if plan.read_last[i] >= first_block]


def index_gets(
    plan: EpochPlan,
    readers: Mapping[str, ArrayReader],
    *,
    held: Sequence[tuple[str, int]],
    budget_bytes: int,
    first_batch_first: bool,
    first_block: int = 0,
) -> tuple[int, int]:
    """``(GETs, bytes)`` of the shard indexes a pass of ``plan`` reads, its split holding ``held`` as it starts.

    ``held`` are ``(shard key, entry bytes)``, least recently used first
    (``SplitIndexes.keys``). Where the pass's shards' entries fit
    ``budget_bytes``, it reads each one not held, once. Else the split's
    cache lets indexes go as the pass's tiles come (least recently used
    first) and a shard's index is read again when a later tile needs it:
    its tiles are replayed here in the order the pass admits them
    (:func:`admitted_reads`), so the count is the pass's exactly.
    """
    sharded = {s: r for s, r in readers.items() if r.geometry.sharded_reads}
    stages = {r.geometry.path: shard_stage(r.geometry) for r in sharded.values()}
    wanted = plan_shards(plan, sharded, stages, first_block)
    if sum(held_index_bytes(stage) for _, stage in wanted) <= budget_bytes:
        have = {key for key, _ in held}
        fresh = [stage for key, stage in wanted if key not in have]
        return len(fresh), sum(stage.index_nbytes for stage in fresh)
    lru: collections.OrderedDict[str, int] = collections.OrderedDict(held)
    total = sum(lru.values())
    gets = nbytes = 0
    wanted_tiles: set[tuple[str, int, int]] = set()  # (path, chunk, tile): selections of one array share a tile
    for i in admitted_reads(plan, first_block, first_batch_first):
        source, chunk = plan.reads[i]
        reader = sharded.get(source)
        if reader is None:
            continue
        g = reader.geometry
        stage = stages[g.path]
        for k, t in enumerate(reader.layout.tiles):
            if (g.path, chunk, t) in wanted_tiles:
                continue
            wanted_tiles.add((g.path, chunk, t))
            key = g.tile_key(reader.tile_coord(chunk, k))[0]
            if key in lru:
                lru.move_to_end(key)
                continue
            gets, nbytes = gets + 1, nbytes + stage.index_nbytes
            lru[key] = held_index_bytes(stage)
            total += lru[key]
            while total > budget_bytes and len(lru) > 1:
                total -= lru.popitem(last=False)[1]
    return gets, nbytes


def _count(
    plan: EpochPlan,
    readers: Mapping[str, ArrayReader],
    permit_cap: int,
    remote: bool,
    indexes: Mapping[str, ShardIndex | None] | None,
    index_reads: int | None,
) -> tuple[int, collections.Counter[str], int]:
    """The GETs a cold pass of ``plan`` sends: each block's distinct tiles of unsharded sources (selections of
    one array share them), and for sharded ones ``index_reads`` index GETs (default one per shard) plus,
    remotely, one per run of each block's inner chunks of each shard (one per inner chunk locally); the tiles its GETs carry whose stored size no index read says, by array path; and
    the bytes of those an index read says (inner chunks of shards whose index is in)."""
    known = indexes or {}
    sources = {s: r for s, r in readers.items() if any(src == s for src, _ in plan.reads)}
    total = 0
    carried: collections.Counter[str] = collections.Counter()
    shards_seen: set[str] = set()
    groups: dict[tuple[int, str, str], set[tuple[int, ...]]] = {}  # (block, path, shard) -> inner chunks wanted
    per_path = collections.Counter(r.geometry.path for r in sources.values())
    shared = {path for path, n in per_path.items() if n > 1}
    tiles: set[tuple[int, str, str]] = set()  # (block, path, key): selections of one array share a block's tiles
    for i, (source, chunk) in enumerate(plan.reads):
        reader = sources[source]
        g = reader.geometry
        block = int(plan.read_first[i])
        if not g.sharded_reads:
            if g.path not in shared:  # one source's reads of an array never share a tile
                total += reader.n_tiles
                carried[g.path] += reader.n_tiles
                continue
            tiles.update((block, g.path, g.tile_key(reader.tile_coord(chunk, k))[0]) for k in range(reader.n_tiles))
            continue
        for k in range(reader.n_tiles):
            key, place = g.tile_key(reader.tile_coord(chunk, k))
            assert place is not None  # sharded reads place every tile in its shard
            shards_seen.add(key)
            groups.setdefault((block, g.path, key), set()).add(place)
    total += len(tiles) + (len(shards_seen) if index_reads is None else index_reads)
    carried.update(path for _, path, _ in tiles)
    cap = run_cap(permit_cap)
    geometries = {r.geometry.path: r.geometry for r in sources.values()}
    spanned = 0
    for (_, path, key), places in groups.items():
        index = known.get(key, _MODELLED)
        spans = _spans(geometries[path], index, places)
        if index is _MODELLED:
            carried[path] += len(spans)
        else:
            spanned += sum(b - a for a, b in spans)
        total += len(coalesce(spans, cap)) if remote else len(spans)
    return total, carried, spanned


def pass_reads(
    plan: EpochPlan,
    readers: Mapping[str, ArrayReader],
    *,
    permit_cap: int,
    remote: bool,
    first_batch_first: bool,
    held: Sequence[tuple[str, int]] = (),
    budget_bytes: int,
    indexes: Mapping[str, ShardIndex | None] | None = None,
) -> dict[str, Any]:
    """What a pass of ``plan`` sends, as ``describe()`` states it for a split (and ``insitubatch inspect``).

    ``gets`` in all and their ``bytes`` (None where a codec compresses: known
    only once read), of them ``index_gets`` for the shard indexes its split
    does not hold (``held``, :func:`index_gets`) and their ``index_bytes``
    (exactly: an index is a fixed range); ``index_held_bytes`` is what the
    split's index cache holds at most for it: its shards' entries, or
    ``budget_bytes`` when they do not fit.
    """
    index_reads, index_bytes = index_gets(
        plan, readers, held=held, budget_bytes=budget_bytes, first_batch_first=first_batch_first
    )
    sharded = {s: r for s, r in readers.items() if r.geometry.sharded_reads}
    stages = {r.geometry.path: shard_stage(r.geometry) for r in sharded.values()}
    need = sum(held_index_bytes(stage) for _, stage in plan_shards(plan, sharded, stages, 0))
    gets, carried, spanned = _count(plan, readers, permit_cap, remote, indexes, index_reads)
    sizes = {r.geometry.path: make_decoder(r.geometry, tile=True).encoded_nbytes() for r in readers.values()}
    unknown = any(sizes[path] is None for path, n in carried.items() if n)
    data = spanned + sum(n * int(sizes[path] or 0) for path, n in carried.items())
    return {
        "gets": gets,
        # a tile's stored size is fixed where no codec compresses, and an index read says an inner chunk's
        "bytes": None if unknown else index_bytes + data,
        "index_gets": index_reads,
        "index_bytes": index_bytes,
        "index_held_bytes": min(need, budget_bytes),
    }


_MODELLED: Any = object()  # an index not read yet: zarr-python's layout is assumed


def _span(index: ShardIndex | None, place: tuple[int, ...]) -> tuple[int, int] | None:
    if index is None:
        return None  # the shard was never written: no inner chunk of it is read
    try:
        return index.span(place)
    except Exception:  # a damaged entry: a bad chunk, decided without a GET
        return None


def _spans(g: Any, index: Any, places: set[tuple[int, ...]]) -> list[tuple[int, int]]:
    """The byte spans of ``places`` in a shard: from its index, or as zarr writes a full shard (unit sizes)."""
    if index is not _MODELLED:
        return [span for p in places if (span := _span(index, p)) is not None]
    ranks = morton_ranks(tuple(s // c for s, c in zip(g.stored_chunks, g.tile_chunks)))
    return [(int(ranks[p]), int(ranks[p]) + 1) for p in places]
