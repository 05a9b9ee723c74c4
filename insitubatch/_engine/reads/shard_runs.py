"""Which GETs a shard's wanted inner chunks take, and how many GETs a pass will send.

A remote pass reads the inner chunks one block wants from one shard
together, after the shard's index: inner chunks that lie back to back in
the shard are one ranged GET (a *run*) of at most :func:`run_cap` of them.
Runs depend only on the plan, the knobs and the shard's layout, never on
timing, so :func:`pass_gets` predicts a cold pass's GETs exactly: one per
shard index (each read once per dataset), plus one per run, plus one per
tile of an unsharded array. Where an index has not been read yet, the
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

from ...plan.epoch import EpochPlan
from .reader import ArrayReader
from .shard_index import ShardIndex

__all__ = ["COALESCE_GAP_BYTES", "MAX_RUN_TILES", "coalesce", "morton_ranks", "pass_gets", "run_cap"]

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


def pass_gets(
    plan: EpochPlan,
    readers: Mapping[str, ArrayReader],
    *,
    permit_cap: int,
    remote: bool,
    indexes: Mapping[str, ShardIndex | None] | None = None,
) -> int:
    """The GETs a cold pass of ``plan`` sends: each block's distinct tiles of unsharded sources (selections of
    one array share them), and for sharded ones an index per
    shard plus, remotely, one per run of each block's inner chunks of each shard (one per inner chunk
    locally). ``indexes`` are shard indexes already read (their layouts, and inner chunks never written:
    no GET); any other shard is taken to be zarr-python's layout with every inner chunk written.
    """
    known = indexes or {}
    sources = {s: r for s, r in readers.items() if any(src == s for src, _ in plan.reads)}
    total = 0
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
                continue
            tiles.update((block, g.path, g.tile_key(reader.tile_coord(chunk, k))[0]) for k in range(reader.n_tiles))
            continue
        for k in range(reader.n_tiles):
            key, place = g.tile_key(reader.tile_coord(chunk, k))
            assert place is not None  # sharded reads place every tile in its shard
            shards_seen.add(key)
            groups.setdefault((block, g.path, key), set()).add(place)
    total += len(tiles) + len(shards_seen)  # a GET per distinct tile of a block, each shard's index once
    cap = run_cap(permit_cap)
    geometries = {r.geometry.path: r.geometry for r in sources.values()}
    for (_, path, key), places in groups.items():
        index = known.get(key, _MODELLED)
        if not remote:
            total += len(places) if index is _MODELLED else sum(_span(index, p) is not None for p in places)
            continue
        total += len(coalesce(_spans(geometries[path], index, places), cap))
    return total


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
