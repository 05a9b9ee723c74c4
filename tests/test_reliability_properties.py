"""Property-based tests of the planner over random geometries, chunkings, windows, blocks, batches and world sizes.

Invariants, each checked against an independent computation:

* sample-once: an epoch's ledger holds every valid anchor of the split exactly
  once (an anchor is valid when every label's window lies inside its array);
* batches: ⌈N / batch_size⌉ of them, only the last short (single rank);
* read-once: a read key appears once per plan (``release_per_block`` may
  re-admit a key, but only after a block that did not use it), and each
  block's reads are exactly the chunks its anchors touch;
* bounded permits: a simulated driver that admits reads greedily under the
  plan's ``working_set_bytes`` / ``read_ahead_bound`` (the pool's
  ``can_take`` rule) and a producer that releases drained blocks never
  deadlock: every batch finds all its reads pinned;
* ranks: equal batch counts on every rank, every sample once across ranks,
  chunk-disjoint training partitions, exactly complete evaluation partitions,
  and a resume at another world size that neither repeats nor skips a sample.

Splits come from ``split_by_chunk`` and from ``split_by_time`` (chunk-granular
and exact edges) over a real time coordinate, so date splits meet every
invariant too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

from insitubatch.io.coords import CoordinateSource
from insitubatch.io.geometry import ArrayGeometry
from insitubatch.plan.dates import split_by_time
from insitubatch.plan.distributed import rank_streams
from insitubatch.plan.epoch import EpochPlan, build_plan, epoch_order, plan_epoch
from insitubatch.plan.first_use import admission_order
from insitubatch.plan.splits import SplitManifest, split_by_chunk

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the time coordinate of the property arrays: hourly steps from here
EPOCH = np.datetime64("2000-01-01T00", "ns")


@functools.cache
def _hourly(n: int) -> CoordinateSource:
    """A store holding only an ``n``-step hourly ``time`` coordinate, CF-encoded."""
    store = MemoryStore()
    cf = {"units": "hours since 2000-01-01", "calendar": "proleptic_gregorian"}
    zarr.create_array(store, name="time", shape=(n,), dtype="i8", dimension_names=("time",), attributes=cf)[:] = (
        np.arange(n)
    )
    return CoordinateSource(store)


def _geometry(path: str, n: int, size: int, inner: tuple[int, ...], dtype: str) -> ArrayGeometry:
    return ArrayGeometry(
        path=path,
        shape=(n, *inner),
        chunks=(size, *inner),
        stored_chunks=(size, *inner),
        dtype=np.dtype(dtype),
        fill_value=0,
        dimension_names=("time", *(f"d{k}" for k in range(len(inner)))),
        coords=_hourly(n),
    )


def _date_split(anchor: ArrayGeometry, cut: int, exact: bool) -> SplitManifest | None:
    """train up to step ``cut - 1``, val from step ``cut`` on, by date; None when a side has no whole chunk."""
    last, first = EPOCH + np.timedelta64(cut - 1, "h"), EPOCH + np.timedelta64(cut, "h")
    ranges = {"train": (None, last), "val": (first, None)}
    try:
        return split_by_time(anchor, ranges, edges="exact" if exact else "chunk")
    except ValueError:
        return None


@dataclass
class Layout:
    manifest: SplitManifest
    split: str
    variables: dict[str, ArrayGeometry]
    block_chunks: int
    batch_size: int
    shuffle: bool
    seed: int
    epoch: int
    anchor_range: tuple[int, int] | None


@st.composite
def layouts(draw) -> Layout:
    n = draw(st.integers(1, 120))
    size = draw(st.integers(1, 16))
    dtype = draw(st.sampled_from(["u1", "f4", "f8"]))
    anchor = _geometry("x", n, size, (draw(st.integers(1, 3)),), dtype)
    arrays = [anchor]
    for k in range(draw(st.integers(0, 2))):  # more arrays, chunked differently on the sample axis
        inner = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
        arrays.append(_geometry(f"a{k}", n, draw(st.integers(1, 20)), inner, draw(st.sampled_from(["u1", "f4"]))))
    variables = {"x": anchor}
    for k in range(draw(st.integers(0, 3))):  # windowed labels: aliases of some array at an offset
        g = draw(st.sampled_from(arrays))
        variables[f"w{k}"] = g.shift(draw(st.integers(-6, 6)))
    for g in arrays[1:]:
        variables.setdefault(g.path, g)
    manifest = None
    if n > 1 and draw(st.booleans()):
        manifest = _date_split(anchor, draw(st.integers(1, n - 1)), draw(st.booleans()))
    if manifest is None:
        # two splits need two chunks: a split takes whole chunks, and each non-zero fraction gets one
        train = draw(st.sampled_from([1.0, 0.7, 0.5])) if -(-n // size) > 1 else 1.0
        manifest = split_by_chunk(
            anchor,
            fractions=(train, 1.0 - train) if train < 1 else (1.0,),
            contiguous=draw(st.booleans()),
            seed=draw(st.integers(0, 100)),
        )
    anchor_range = None
    if draw(st.booleans()):
        lo = draw(st.integers(0, n - 1))
        anchor_range = (lo, draw(st.integers(lo + 1, n)))
    return Layout(
        manifest=manifest,
        split=draw(st.sampled_from(manifest.names)),
        variables=variables,
        block_chunks=draw(st.integers(1, 6)),
        batch_size=draw(st.integers(1, 20)),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        epoch=draw(st.integers(0, 5)),
        anchor_range=anchor_range,
    )


def _valid_anchors(layout: Layout) -> list[int]:
    """The anchors an epoch must hold, computed sample by sample."""
    n = layout.manifest.n_samples
    lo, hi = layout.anchor_range or (0, n)
    return [
        int(a)
        for a in layout.manifest.sample_indices(layout.split)
        if lo <= a < hi and all(0 <= a + g.offset < n for g in layout.variables.values())
    ]


def _touched(variables: dict[str, ArrayGeometry], anchors: np.ndarray) -> set[tuple[str, int]]:
    """The (array path, sample-axis chunk) keys that reading ``anchors`` touches, label by label."""
    keys: set[tuple[str, int]] = set()
    for g in variables.values():
        keys.update((g.path, int(c)) for c in (anchors + g.offset) // g.sample_chunk_size)
    return keys


def _check_reads(plan: EpochPlan, variables: dict[str, ArrayGeometry], release_per_block: bool) -> None:
    """Each block's reads are exactly what its anchors touch; keys are read once (or re-read only after a gap)."""
    geoms = {g.path: g for g in variables.values()}
    for b in range(plan.n_blocks):
        anchors = plan.anchors[plan.block_starts[b] : plan.block_starts[b + 1]]
        mine = [plan.reads[i] for i in plan.block_reads[b]]
        assert len(mine) == len(set(mine)), f"block {b} reads a key twice"
        assert set(mine) == _touched(variables, anchors), f"block {b} reads other chunks than its anchors touch"
        for i in plan.block_reads[b]:
            assert plan.read_first[i] <= b <= plan.read_last[i]
    for i, (path, c) in enumerate(plan.reads):
        users = [b for b in range(plan.n_blocks) if i in plan.block_reads[b]]
        assert users and users[0] == plan.read_first[i] and users[-1] == plan.read_last[i]
        assert plan.read_nbytes[i] == geoms[path].chunk_len(c) * geoms[path].sample_nbytes
    if not release_per_block:
        assert len(plan.reads) == len(set(plan.reads)), "a key is read twice in one plan"
    else:
        spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for i, key in enumerate(plan.reads):
            spans.setdefault(key, []).append((int(plan.read_first[i]), int(plan.read_last[i])))
        for key, s in spans.items():
            for (_, last), (first, _) in zip(s, s[1:]):
                assert first > last + 1, f"{key} re-read at block {first} although block {first - 1} could keep it"


def _simulate(plan: EpochPlan) -> int:
    """Run the driver/producer protocol under the plan's permits; return the peak pinned bytes.

    The driver admits reads in ``read_first`` order while the pool's
    ``can_take`` rule allows (the owner's reservation is ``working_set_bytes``,
    its read limit ``read_ahead_bound``; one read is always allowed when none is
    pinned). Before batch ``k`` the driver has admitted all it can; the batch
    needs every read of its blocks pinned, else the pass would deadlock. After
    the batch, blocks it drained release their last-use reads.
    """
    reservation, limit = plan.working_set_bytes, max(plan.read_ahead_bound, 1)
    admit = np.argsort(plan.read_first, kind="stable").tolist()
    pinned: dict[int, int] = {}
    nxt, released, peak = 0, -1, 0
    for k in range(plan.n_batches):
        b0, b1 = plan.batch_blocks(k)
        while nxt < len(admit):
            i = admit[nxt]
            nbytes = int(plan.read_nbytes[i])
            if not ((sum(pinned.values()) + nbytes <= reservation and len(pinned) + 1 <= limit) or not pinned):
                break
            pinned[i] = nbytes
            nxt += 1
        need = {i for b in range(b0, b1 + 1) for i in plan.block_reads[b]}
        missing = need - set(pinned)
        assert not missing, f"batch {k} deadlocks: reads {sorted(missing)} cannot be admitted under the permits"
        peak = max(peak, sum(pinned.values()))
        _, stop = plan.batch_rows(k)
        while released + 1 < plan.n_blocks and plan.block_starts[released + 2] <= stop:
            released += 1
            for i in np.flatnonzero(plan.read_last == released).tolist():
                pinned.pop(i, None)
    assert not pinned, "reads stay pinned after the last batch"
    return peak


def _epoch_plan(layout: Layout, release_per_block: bool):
    """The layout's epoch order and the plan built from it."""
    kw = dict(block_chunks=layout.block_chunks, shuffle=layout.shuffle, anchor_range=layout.anchor_range)
    eo = epoch_order(layout.manifest, layout.split, layout.variables, seed=layout.seed, epoch=layout.epoch, **kw)
    plan = build_plan(
        layout.manifest,
        layout.variables,
        eo.order,
        eo.block_starts,
        layout.batch_size,
        release_per_block=release_per_block,
    )
    return eo, plan


# --- single rank ----------------------------------------------------------------------


@pytest.mark.invariant
@SETTINGS
@given(layout=layouts(), release_per_block=st.booleans())
def test_single_rank_plan_invariants(layout: Layout, release_per_block: bool) -> None:
    eo, plan = _epoch_plan(layout, release_per_block)
    # sample-once
    anchors = plan.anchors.tolist()
    assert sorted(anchors) == _valid_anchors(layout)
    assert len(anchors) == len(set(anchors))
    S = layout.manifest.sample_chunk_size
    assert np.all(plan.order[:, 1] < S) and np.array_equal(plan.anchors, plan.order[:, 0] * S + plan.order[:, 1])
    if not layout.shuffle:
        assert anchors == sorted(anchors)
    # blocks hold whole chunks: block_chunks of them at most, each chunk in one block
    chunk_block = {}
    for b in range(plan.n_blocks):
        chunks = set(plan.order[plan.block_starts[b] : plan.block_starts[b + 1], 0].tolist())
        assert len(chunks) <= layout.block_chunks
        for c in chunks:
            assert chunk_block.setdefault(c, b) == b, f"chunk {c} is in two blocks"
    # ⌈N/bs⌉ batches, only the last short
    n, bs = len(anchors), layout.batch_size
    assert plan.n_batches == -(-n // bs)
    sizes = [plan.batch_rows(k)[1] - plan.batch_rows(k)[0] for k in range(plan.n_batches)]
    assert all(s == bs for s in sizes[:-1]) and (not sizes or 0 < sizes[-1] <= bs)
    assert sum(sizes) == n
    # read-once, and reads are exactly what the anchors touch
    _check_reads(plan, layout.variables, release_per_block)
    # the derived bounds really bound what the producer needs
    peak = _simulate(plan)
    assert peak <= max(plan.working_set_bytes, int(plan.read_nbytes.max(initial=0)))
    if not release_per_block:
        same = plan_epoch(
            layout.manifest,
            layout.split,
            layout.variables,
            batch_size=bs,
            block_chunks=layout.block_chunks,
            shuffle=layout.shuffle,
            seed=layout.seed,
            epoch=layout.epoch,
            anchor_range=layout.anchor_range,
        )
        assert np.array_equal(same.order, plan.order) and same.reads == plan.reads


@SETTINGS
@given(layout=layouts())
def test_order_depends_on_seed_and_epoch_only(layout: Layout) -> None:
    kw = dict(block_chunks=layout.block_chunks, shuffle=layout.shuffle, anchor_range=layout.anchor_range)
    a = epoch_order(layout.manifest, layout.split, layout.variables, seed=layout.seed, epoch=layout.epoch, **kw)
    b = epoch_order(
        layout.manifest,
        layout.split,
        dict(reversed(list(layout.variables.items()))),
        seed=layout.seed,
        epoch=layout.epoch,
        **kw,
    )
    assert np.array_equal(a.order, b.order) and np.array_equal(a.block_starts, b.block_starts)


def _order_chunk_by_chunk(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """The epoch's order the plain way: chunk by chunk, block by block, drawing from the same generator."""
    m, S = layout.manifest, layout.manifest.sample_chunk_size
    valid = set(_valid_anchors(layout))
    rng = np.random.default_rng([layout.seed, layout.epoch])
    chunks = np.asarray(m.chunks(layout.split), dtype=np.int64)
    if layout.shuffle:
        chunks = rng.permutation(chunks)
    parts, starts = [], [0]
    for b in range(0, len(chunks), layout.block_chunks):
        rows = [(c, w) for c in chunks[b : b + layout.block_chunks].tolist() for w in range(S) if c * S + w in valid]
        if rows:
            part = np.asarray(rows, dtype=np.int64)
            parts.append(part[rng.permutation(len(part))] if layout.shuffle else part)
            starts.append(starts[-1] + len(part))
    return (np.concatenate(parts) if parts else np.empty((0, 2), np.int64)), np.asarray(starts)


@SETTINGS
@given(layout=layouts(), blocks=st.integers(1, 4))
def test_order_equals_the_chunk_by_chunk_order_and_its_first_blocks_alone(layout: Layout, blocks: int) -> None:
    kw = dict(block_chunks=layout.block_chunks, shuffle=layout.shuffle, anchor_range=layout.anchor_range)
    eo = epoch_order(layout.manifest, layout.split, layout.variables, seed=layout.seed, epoch=layout.epoch, **kw)
    order, starts = _order_chunk_by_chunk(layout)
    assert np.array_equal(eo.order, order) and np.array_equal(eo.block_starts, starts)
    head = epoch_order(
        layout.manifest, layout.split, layout.variables, seed=layout.seed, epoch=layout.epoch, blocks=blocks, **kw
    )
    assert np.array_equal(head.block_starts, starts[: blocks + 1])
    assert np.array_equal(head.order, order[: starts[: blocks + 1][-1]])


def _reads_block_by_block(layout: Layout, order: np.ndarray, starts: np.ndarray, release: bool) -> tuple:
    """Each block's reads the plain way: block by block, chunk by chunk, a dict of the reads so far."""
    S = layout.manifest.sample_chunk_size
    anchors = order[:, 0] * S + order[:, 1]
    sources: dict[str, ArrayGeometry] = {}
    for g in layout.variables.values():
        sources.setdefault(g.source, g)
    paths = {p: k for k, p in enumerate(dict.fromkeys(g.path for g in sources.values()))}
    index: dict[tuple[str, int], int] = {}
    reads, first, last, nbytes, block_reads = [], [], [], [], []
    for b in range(len(starts) - 1):
        wanted = set()
        for s, (source, g) in enumerate(sources.items()):
            offsets = {off for v in layout.variables.values() if v.source == source for off in v.read_offsets}
            for a in anchors[starts[b] : starts[b + 1]].tolist():
                wanted |= {(paths[g.path], (a + off) // g.sample_chunk_size, s, source) for off in offsets}
        mine = []
        for _, c, _, source in sorted(wanted):
            i = index.get((source, c))
            if i is None or (release and last[i] < b - 1):
                i = index[(source, c)] = len(reads)
                reads.append((source, c))
                first.append(b)
                nbytes.append(sources[source].chunk_len(c) * sources[source].sample_nbytes)
                last.append(b)
            last[i] = b
            mine.append(i)
        block_reads.append(tuple(mine))
    return tuple(reads), first, last, nbytes, tuple(block_reads)


@SETTINGS
@given(layout=layouts(), release_per_block=st.booleans())
def test_reads_equal_the_block_by_block_reads(layout: Layout, release_per_block: bool) -> None:
    eo, plan = _epoch_plan(layout, release_per_block)
    reads, first, last, nbytes, block_reads = _reads_block_by_block(
        layout, eo.order, eo.block_starts, release_per_block
    )
    assert plan.reads == reads and plan.block_reads == block_reads
    assert plan.read_first.tolist() == first and plan.read_last.tolist() == last
    assert plan.read_nbytes.tolist() == nbytes


@SETTINGS
@given(layout=layouts(), release_per_block=st.booleans(), data=st.data())
def test_a_pass_sends_its_first_batch_first_with_each_stored_chunks_reads_side_by_side(
    layout: Layout, release_per_block: bool, data
) -> None:
    _, plan = _epoch_plan(layout, release_per_block)
    if plan.n_blocks == 0:
        return
    b = data.draw(st.integers(0, plan.n_blocks - 1), label="first block (a resumed pass when > 0)")
    sent = admission_order(plan, b)
    later = [i for i in np.argsort(plan.read_first, kind="stable").tolist() if plan.read_first[i] > b]
    held = sorted(int(i) for i in np.flatnonzero((plan.read_first <= b) & (plan.read_last >= b)))
    head = sent[: len(held)]
    assert sorted(head) == held  # the reads block b holds, each once, first
    assert sent[len(held) :] == later  # then later blocks' in plan order; reads only earlier blocks use left out
    # the reference: row by row through block b, each read at the first row that needs it
    lo, hi = int(plan.block_starts[b]), int(plan.block_starts[b + 1])
    first_row: dict[tuple[str, int], int] = {}
    for row in range(lo, hi):
        a = int(plan.anchors[row])
        for v in layout.variables.values():
            for off in v.read_offsets:
                first_row.setdefault((v.source, (a + off) // v.sample_chunk_size), row - lo)
    per = {  # read chunks per stored chunk: a shard's inner chunks go out side by side, to share GETs
        v.source: v.stored_chunks[v.sample_axis] // v.tile_chunks[v.sample_axis] if v.sharded_reads else 1
        for v in layout.variables.values()
    }
    paths = {v.source: v.path for v in layout.variables.values()}
    chunk_of = {i: (paths[plan.reads[i][0]], plan.reads[i][1] // per[plan.reads[i][0]]) for i in head}
    group_row: dict[tuple[str, int], int] = {}
    for i in head:
        group_row[chunk_of[i]] = min(group_row.get(chunk_of[i], hi), first_row.get(plan.reads[i], hi))
    ranks = [group_row[chunk_of[i]] for i in head]
    assert ranks == sorted(ranks)  # the first batch's chunks first, and so on
    runs = [chunk_of[i] for k, i in enumerate(head) if k == 0 or chunk_of[head[k - 1]] != chunk_of[i]]
    assert len(runs) == len(set(runs))  # one stored chunk's reads side by side
    for k in range(1, len(head)):  # and within it in plan order
        if chunk_of[head[k]] == chunk_of[head[k - 1]]:
            assert head[k] > head[k - 1]


# --- many ranks -------------------------------------------------------------------------


@pytest.mark.invariant
@SETTINGS
@given(layout=layouts(), world=st.integers(1, 5), last_batch=st.sampled_from(["pad", "drop", "partial"]))
def test_training_ranks_get_equal_batches_and_every_sample_once(layout: Layout, world: int, last_batch: str) -> None:
    eo = epoch_order(
        layout.manifest,
        layout.split,
        layout.variables,
        block_chunks=layout.block_chunks,
        shuffle=layout.shuffle,
        seed=layout.seed,
        epoch=layout.epoch,
        anchor_range=layout.anchor_range,
    )
    bs = layout.batch_size
    streams = rank_streams(eo, world, batch_size=bs, last_batch=last_batch)
    assert len(streams) == world
    plans = [
        build_plan(
            layout.manifest,
            layout.variables,
            eo.order[s.rows],
            s.block_starts,
            bs,
            padded=s.padded if s.padded.any() else None,
        )
        for s in streams
    ]
    counts = {p.n_batches for p in plans}
    assert len(counts) == 1, f"ranks have different batch counts {[p.n_batches for p in plans]}: DDP would hang"
    total = len(eo.order)
    real = np.concatenate([s.rows[~s.padded] for s in streams]) if streams else np.empty(0, dtype=np.int64)
    assert len(real) == len(set(real.tolist())), "a sample is dealt to two ranks"
    if world == 1:  # the order as it is, its end as the policy says
        real_rows = streams[0].rows[~streams[0].padded]
        kept = total if last_batch != "drop" else total // bs * bs
        assert np.array_equal(real_rows, np.arange(kept))
        assert len(streams[0].rows) == (-(-total // bs) * bs if last_batch == "pad" else kept)
    elif last_batch == "partial":
        assert sorted(real.tolist()) == list(range(total)), "partial must keep every sample"
        n = plans[0].n_batches
        for s in streams:  # every batch full but the last, which holds a real sample
            assert (n - 1) * bs < len(s.rows) <= n * bs
        if total >= world * ((n - 1) * bs + 1):  # enough samples for every rank's last batch: no repeats
            assert not any(s.padded.any() for s in streams)
    elif last_batch == "pad":
        assert sorted(real.tolist()) == list(range(total)), "pad must keep every sample"
        n_rows = max(-(-int((~s.padded).sum()) // bs) for s in streams) * bs
        for s in streams:
            assert len(s.rows) == n_rows  # every batch of every rank is full
            own = set(s.rows[~s.padded].tolist())
            if own:
                assert set(s.rows[s.padded].tolist()) <= own, "padding repeats another rank's samples"
    else:
        n_rows = len(streams[0].rows)
        assert all(len(s.rows) == n_rows for s in streams) and n_rows % bs == 0
        assert not any(s.padded.any() for s in streams)
    # training partitions are chunk-disjoint on the anchor grid: every chunk is dealt to one rank (partial moves
    # the ends of long ranks to short ones)
    owners: dict[int, int] = {}
    for r, s in enumerate(streams if last_batch != "partial" else ()):
        for c in set(eo.order[s.rows[~s.padded], 0].tolist()):
            assert owners.setdefault(c, r) == r, f"chunk {c} is dealt to ranks {owners[c]} and {r}"
    for plan in plans:
        _check_reads(plan, layout.variables, release_per_block=False)
        _simulate(plan)


@SETTINGS
@given(layout=layouts(), world=st.integers(1, 8), history=st.booleans(), data=st.data())
def test_training_ranks_are_balanced_to_one_chunk(layout: Layout, world: int, history: bool, data) -> None:
    """Sample counts differ by at most one chunk, so pad/drop is under one chunk plus one batch per rank."""
    eo = epoch_order(
        layout.manifest,
        layout.split,
        layout.variables,
        block_chunks=layout.block_chunks,
        shuffle=True,
        seed=layout.seed,
        epoch=layout.epoch,
        anchor_range=layout.anchor_range,
    )
    bs = layout.batch_size
    segments = []
    if history:  # balance holds for what is left after an elastic resume too
        old = data.draw(st.integers(1, 8))
        n_old = len(rank_streams(eo, old, batch_size=bs)[0].rows) // bs
        segments = [(old, data.draw(st.integers(0, n_old)))]
    padded = rank_streams(eo, world, batch_size=bs, last_batch="pad", history=segments)
    dropped = rank_streams(eo, world, batch_size=bs, last_batch="drop", history=segments)
    dealt = [int((~s.padded).sum()) for s in padded]
    chunk_rows = np.bincount(eo.order[:, 0]) if len(eo.order) else np.zeros(1, dtype=np.int64)
    one_chunk = int(chunk_rows.max())
    assert max(dealt) - min(dealt) <= one_chunk, f"rank sample counts {dealt} differ by more than a chunk"
    for s, d, cut in zip(padded, dealt, dropped):
        assert int(s.padded.sum()) <= one_chunk + bs - 1, "padding exceeds one chunk plus one batch"
        assert d - len(cut.rows) <= one_chunk + bs - 1, "dropping exceeds one chunk plus one batch"
    block_of = np.searchsorted(eo.block_starts, np.arange(len(eo.order)), side="right") - 1
    for s in padded:
        real = s.rows[~s.padded]
        for b in range(len(s.block_starts) - 1):
            rows = real[s.block_starts[b] : min(s.block_starts[b + 1], len(real))]
            # a rank's shuffle block is a global block or part of one, its rows in that block's shuffled order
            assert len(set(block_of[rows].tolist())) <= 1
            assert np.all(np.diff(rows) > 0) if len(rows) else True


@SETTINGS
@given(layout=layouts(), world=st.integers(1, 5))
def test_evaluation_ranks_are_exactly_complete_and_chunk_aligned(layout: Layout, world: int) -> None:
    eo = epoch_order(
        layout.manifest,
        layout.split,
        layout.variables,
        block_chunks=layout.block_chunks,
        shuffle=False,
        seed=layout.seed,
        epoch=layout.epoch,
        anchor_range=layout.anchor_range,
    )
    streams = rank_streams(eo, world, batch_size=layout.batch_size, contiguous=True)
    rows = np.concatenate([s.rows for s in streams])
    assert np.array_equal(rows, np.arange(len(eo.order))), "evaluation must read every sample once, in order"
    owners: dict[int, int] = {}
    for r, s in enumerate(streams):
        assert not s.padded.any()
        for c in set(eo.order[s.rows, 0].tolist()):
            assert owners.setdefault(c, r) == r, f"chunk {c} is split between ranks {owners[c]} and {r}"
        plan = build_plan(layout.manifest, layout.variables, eo.order[s.rows], s.block_starts, layout.batch_size)
        _check_reads(plan, layout.variables, release_per_block=False)
        _simulate(plan)


@pytest.mark.invariant
@SETTINGS
@given(layout=layouts(), old=st.integers(1, 4), new=st.integers(1, 4), data=st.data())
def test_resume_at_another_world_size_neither_repeats_nor_skips(layout: Layout, old: int, new: int, data) -> None:
    eo = epoch_order(
        layout.manifest,
        layout.split,
        layout.variables,
        block_chunks=layout.block_chunks,
        shuffle=True,
        seed=layout.seed,
        epoch=layout.epoch,
        anchor_range=layout.anchor_range,
    )
    bs = layout.batch_size
    before = rank_streams(eo, old, batch_size=bs)
    n_batches = len(before[0].rows) // bs if before else 0
    k = data.draw(st.integers(0, n_batches))
    consumed = set()
    for s in before:
        consumed.update(s.rows[: k * bs][~s.padded[: k * bs]].tolist())
    after = rank_streams(eo, new, batch_size=bs, history=[(old, k)])
    rest = np.concatenate([s.rows[~s.padded] for s in after]).tolist()
    assert len(rest) == len(set(rest)), "a remaining sample is dealt twice"
    assert not consumed & set(rest), "a consumed sample is dealt again"
    assert consumed | set(rest) == set(range(len(eo.order))), "a sample is skipped by the resume"
    assert len({-(-len(s.rows) // bs) for s in after}) == 1


def test_property_settings_are_not_trivially_small() -> None:
    """Guard: the strategies above really reach multi-block, multi-batch, windowed layouts."""
    seen = {"blocks": 0, "windows": 0, "batches": 0, "exact_dates": 0}

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(layout=layouts())
    def probe(layout: Layout) -> None:
        plan = plan_epoch(
            layout.manifest,
            layout.split,
            layout.variables,
            batch_size=layout.batch_size,
            block_chunks=layout.block_chunks,
            shuffle=layout.shuffle,
            seed=layout.seed,
            epoch=layout.epoch,
            anchor_range=layout.anchor_range,
        )
        seen["blocks"] = max(seen["blocks"], plan.n_blocks)
        seen["batches"] = max(seen["batches"], plan.n_batches)
        seen["windows"] = max(seen["windows"], sum(1 for g in layout.variables.values() if g.offset))
        seen["exact_dates"] += layout.manifest.split_range(layout.split) is not None

    probe()
    assert seen["blocks"] >= 5 and seen["batches"] >= 5 and seen["windows"] >= 2, seen
    assert seen["exact_dates"] >= 5, seen
