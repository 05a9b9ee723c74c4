"""``InSituDataset``: a zarr store's splits as views of shuffled batches, read in place.

The dataset resolves the variables and builds, once, what every pass
shares: a ``PassContext`` (readers, the ``ChunkPool`` and its disk cache,
batch buffers, the decode pool, the read permits, the epoch's counters) and
an ``EpochPlanner``. Views (``views.py``) read only those two to plan and
start passes (``_engine/passes/producer.py``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ._engine.lifecycle import close_at_exit, closed, closing_deferred, dropped
from ._engine.loop import decode_pool
from ._engine.passes.context import ON_BAD_CHUNK, BatchTransform, OnBadChunk, PassContext, read_sources
from ._engine.passes.context import concurrency_report as _concurrency
from ._engine.passes.warm import open_reads
from ._engine.pool.buffers import BufferPool
from ._engine.pool.chunk_pool import ChunkPool
from ._engine.reads.reader import BadChunkRecord
from ._engine.reads.store_link import route_report
from ._validate import callables, flag, positive_int, positive_int_or_auto
from .cache import CacheOptions, OnCorrupt, open_dataset_cache
from .cache.fingerprint import array_fingerprints
from .io.geometry import ArrayGeometry, sample_coords
from .io.group import resolve_statics, resolve_variables
from .io.sources.joined import JoinedStore
from .io.statics import StaticField, read_statics
from .plan.anchors import with_declared_times
from .plan.cost import KNOBS, describe_loader, format_summary
from .plan.dates import inference_range
from .plan.distributed import LastBatch, Remainder, last_batch_policy, resolve_last_batch, resolve_world
from .plan.epoch import EpochPlan
from .plan.planner import EpochPlanner
from .plan.read_groups import read_group
from .plan.splits import SplitManifest
from .plan.store_shares import store_shares
from .stores.obstore_stores import as_store
from .stores.owned import close_store
from .transforms import ChunkTransform, check_scopes
from .views import DatasetView, InferView

__all__ = ["InSituDataset"]

ALL_SPLIT = "__all__"  # the pseudo-split of ``ds.all``: every chunk, sequential
# settings ``describe()`` reports as resolved (after defaults and the environment), besides the knobs
RESOLVED = ("shuffle", "seed", "epoch", "rank", "world_size", "last_batch", "on_bad_chunk", "decode_threads")


class InSituDataset:
    """Train/val/test views over a zarr store, read in place.

    Parameters
    ----------
    store
        A zarr ``Store``, or a URL/path (opened read-only with ``obstore_store``).
        Reads retry within the store's ``retry`` bounds and abandon stalls
        (docs/tuning.md); what still fails raises ``StoreReadError`` naming
        array, chunk and key. A missing chunk key reads as the fill value.
    manifest
        The ``SplitManifest`` whose chunk grid is the anchor grid.
    variables
        ``{label: ArrayGeometry}`` (a ``shift(k)`` view is a windowed label,
        an ``isel``/``sel`` view reads only what it selects), a list of array
        paths (labels = paths), or ``None`` for every array with the sample
        axis (``describe()`` lists what that left out, and why).
    statics
        Static fields (arrays without the sample axis: masks, orography):
        ``{label: StaticField}`` from ``open_statics`` (selections allowed),
        or a list of array paths. Read once here; ``ds.statics`` and every
        batch's ``batch.statics`` hold the same read-only arrays.
    batch_size, shuffle, block_chunks, seed
        Batches per step; whether ``train`` is shuffled (``val``/``test`` are
        always sequential); chunks per shuffle block; the order's seed.
    max_inflight
        Fetches in flight at once, across every pass: ``"auto"`` (tuned while
        passes run, up to the memory plan's cap; docs/tuning.md) or an int.
    prefetch_depth
        Batches the producer assembles ahead of the consumer.
    cache_budget_bytes
        Pool byte budget; ``None`` is the working set of the open passes.
    on_bad_chunk
        ``"raise"`` or ``"nan"`` (a tile that fails to decode becomes NaN or
        the fill value, and is listed in ``bad_chunks`` for the current
        epoch). A fetch that still fails after the store's retries is not a
        bad chunk under either policy: it raises ``StoreReadError``, because
        an outage or a denied key is not data, and filling it would train on
        holes whenever the network fails (a resumed pass fetches it again).
    chunk_transforms, batch_transforms
        Per-chunk transforms (decode pool, cached) and per-batch ones (producer thread).
    decode_threads
        Threads of the process-wide decode pool (default: one per core).
    hedge
        Duplicate a remote GET far slower than its peers (at most 5% extra GETs).
    missing, frequency
        Declared missing dates and the anchors' spacing, added to the
        manifest's (``split_by_time(missing=, frequency=)``; docs/dates.md):
        ``ds.manifest`` records them for every split, rank and pass.
    rank, world_size
        This process's share of each epoch. Unset: from an initialized
        ``torch.distributed`` group, else JAX's processes, else ``RANK``/``WORLD_SIZE``, else 0 of 1.
    last_batch, remainder
        A training pass's unfilled last batch, ranks kept at equal batch counts: ``"pad"`` fills it with the rank's
        own samples, marked in ``batch.extras["padded"]``; ``"drop"`` drops it; ``"partial"`` yields it short.
        ``None``: pad on several ranks, partial on one (``plan.distributed``). ``remainder``: deprecated alias.
    read_group_size, read_group_part
        Model-parallel read groups (``plan.read_groups``): ``G`` consecutive ranks (or a torch process group)
        read the same samples in the same order, each member its part of every sample: a band along the
        dimension ``read_group_part`` names, cut at tile edges, or ``read_group_part[rank % G]`` (an ``isel``).
        The epoch is dealt to the ``world_size // G`` replicas; ``ds.read_group`` says which part is this rank's.
    cache_dir
        Back the pool with mmap'd tile-major ``.npy`` tile files here (local
        NVMe). Any number of processes of one host may write one directory
        (DDP ranks, several jobs): each revives what the others finished.
    persist
        Keep tile files and log each completed chunk, so later runs revive
        them without fetching or decoding. Windowed shuffled passes then
        release each block's chunks and revive them from disk when needed.
    reset_stale_cache
        Rebuild the arrays whose chunk transforms changed instead of raising.
    readonly_cache
        Share a warmed cache with other readers; a chunk it lacks raises.
    cache_disk_bytes
        Most bytes the persisted tile files in ``cache_dir`` may take, across
        every writer; past it new chunks stay in memory only (one WARNING per
        pass). ``None``: until the disk is full, which also only stops
        persisting (one WARNING).
    on_corrupt_cache
        A persisted tile file whose checksum (or header) is wrong is re-made
        from the store with one WARNING (``"refetch"``), or raises
        ``CacheCorruptError`` (``"raise"``).
    """

    def __init__(
        self,
        store: Any,
        manifest: SplitManifest,
        variables: Mapping[str, ArrayGeometry] | Sequence[str] | None = None,
        *,
        batch_size: int = 32,
        shuffle: bool = True,
        block_chunks: int = 16,
        max_inflight: int | Literal["auto"] = "auto",
        prefetch_depth: int = 2,
        cache_budget_bytes: int | None = None,
        seed: int = 0,
        on_bad_chunk: OnBadChunk = "raise",
        chunk_transforms: Sequence[ChunkTransform] = (),
        batch_transforms: Sequence[BatchTransform] = (),
        decode_threads: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        last_batch: LastBatch | None = None,
        remainder: Remainder | None = None,
        cache_dir: str | os.PathLike | None = None,
        persist: bool = False,
        reset_stale_cache: bool = False,
        readonly_cache: bool = False,
        statics: Mapping[str, StaticField] | Sequence[str] | None = None,
        cache_disk_bytes: int | None = None,
        on_corrupt_cache: OnCorrupt = "refetch",
        hedge: bool = True,
        missing: Sequence[Any] | None = None,
        frequency: str | np.timedelta64 | None = None,
        read_group_size: Any = None,
        read_group_part: str | Sequence[Mapping[Any, Any]] | None = None,
    ) -> None:
        closing_deferred()  # what datasets nobody closed left behind (a cache's lock, say) goes first
        if not isinstance(manifest, SplitManifest):
            raise TypeError(f"manifest must be a SplitManifest (from split_by_chunk), got {type(manifest).__name__}")
        self.batch_size = positive_int("batch_size", batch_size)
        self.block_chunks = positive_int("block_chunks", block_chunks)
        self.max_inflight: int | Literal["auto"] = positive_int_or_auto("max_inflight", max_inflight)
        self.hedge = flag("hedge", hedge)
        self.prefetch_depth = positive_int("prefetch_depth", prefetch_depth)
        self.seed = positive_int("seed", seed, minimum=0)
        if decode_threads is not None:
            decode_threads = positive_int("decode_threads", decode_threads)
        if on_bad_chunk not in ON_BAD_CHUNK:
            raise ValueError(f"on_bad_chunk={on_bad_chunk!r} must be one of {ON_BAD_CHUNK}")
        if cache_budget_bytes is not None:
            cache_budget_bytes = positive_int("cache_budget_bytes", cache_budget_bytes)
        self.shuffle = flag("shuffle", shuffle)
        cache_options = CacheOptions(
            cache_dir,
            persist=persist,
            readonly=readonly_cache,
            reset_stale=reset_stale_cache,
            disk_bytes=cache_disk_bytes,
            on_corrupt=on_corrupt_cache,
        )
        self.rank, self.world_size = resolve_world(rank, world_size)
        self.read_group = group = read_group(read_group_size, read_group_part, self.rank, self.world_size)
        last_batch = last_batch_policy(last_batch, remainder)
        self.last_batch: LastBatch = resolve_last_batch(last_batch, group.replicas)
        self.on_bad_chunk = on_bad_chunk
        self.manifest = manifest
        self._opened_store = not hasattr(store, "get") or not hasattr(store, "set")
        self.store = as_store(store)
        self.left_out: dict[str, str] = {}  # what variables=None left out of the store, with why
        if isinstance(self.store, JoinedStore):  # variables of several stores, on the anchor store's dates
            self.variables = self.store.resolve(variables, manifest.n_samples)
            statics_found = self.store.resolve_statics(statics)
        else:
            self.variables, self.left_out = resolve_variables(self.store, variables, manifest.n_samples)
            statics_found = resolve_statics(self.store, statics)
        self.read_group_bands = group.bands(self.variables)  # this member's part of every sample
        self.variables = group.cut(self.variables, self.read_group_bands)
        self.manifest = manifest = with_declared_times(manifest, self.variables, missing, frequency)
        self.static_fields = group.cut(statics_found, self.read_group_bands)
        clash = sorted(set(self.static_fields) & set(self.variables))
        if clash:
            raise ValueError(f"labels {clash} name both a variable and a static; give each its own label")
        self.chunk_transforms = callables("chunk_transforms", chunk_transforms)
        check_scopes(self.chunk_transforms, {g.path for g in self.variables.values()})
        self.batch_transforms = callables("batch_transforms", batch_transforms)
        self.readers, self.outputs = read_sources(self.variables, self.chunk_transforms)
        self.cache = open_dataset_cache(cache_options, fingerprints=self._fingerprints, store=self.store)
        self.persist = cache_options.persist
        cache = self.cache  # an entry the pool evicts leaves the disk cache's accounting too
        self.pool = ChunkPool(cache_budget_bytes, on_evict=None if cache is None else lambda e: cache.evict(*e.key))
        self.buffers = BufferPool()
        self.executor = decode_pool(decode_threads)
        self.decode_threads = decode_threads if decode_threads is not None else (os.cpu_count() or 1)
        self.context = PassContext(
            store=self.store,
            readers=self.readers,
            outputs=self.outputs,
            offsets={lb: g.offset for lb, g in self.variables.items()},
            windows={lb: g.window_steps for lb, g in self.variables.items() if g.window_steps},
            pool=self.pool,
            buffers=self.buffers,
            executor=self.executor,
            max_inflight=self.max_inflight,
            decode_threads=self.decode_threads,
            prefetch_depth=self.prefetch_depth,
            on_bad_chunk=on_bad_chunk,
            cache=self.cache,
            persist=self.persist,
            batch_transforms=self.batch_transforms,
            sample_coords=self.sample_coords,
            hedge=self.hedge,
        )
        self.planner = EpochPlanner(
            manifest=manifest,
            outputs=self.outputs,
            batch_size=self.batch_size,
            block_chunks=self.block_chunks,
            shuffle=self.shuffle,
            seed=self.seed,
            rank=group.replica,  # the epoch is dealt to model replicas: a read group's members read alike
            world_size=group.replicas,
            last_batch=last_batch,
            release_per_block=self.persist,
            variables=self.variables,
        )
        self._views: dict[str, DatasetView] = {}
        close_at_exit(self)  # however the script ends, closed while zarr's loop still runs (``lifecycle``)
        try:  # read once here, not in a pass (whose GETs are the chunks')
            self._coords: dict[str, np.ndarray] = open_reads(
                self.context,
                self.planner,
                functools.partial(sample_coords, self.variables.values(), self.manifest.n_samples),
                functools.partial(read_statics, self.store, self.static_fields),
            )
        except BaseException:
            self.close()  # the warm-up's reads, the cache's lock, a store it opened: nothing outlives a failed open
            raise

    # -- construction helpers ---------------------------------------------------
    @functools.cached_property
    def inner_coords(self) -> dict[str, dict[str, np.ndarray]]:
        """Per label, the coordinate values of its (selected) field dimensions: once per dataset, not per batch."""
        return {label: g.inner_coords() for label, g in self.variables.items()}

    @property
    def statics(self) -> Mapping[str, np.ndarray]:
        """The static fields by label: read-only arrays, read once, the same objects every batch carries."""
        return self.context.statics

    def _fingerprints(self) -> dict[str, str]:
        """Each read source's chunk-transform fingerprint: its array path's (a selection changes the name, not it)."""
        by_path = array_fingerprints(self.chunk_transforms, {r.geometry.path for r in self.readers.values()})
        return {source: by_path[r.geometry.path] for source, r in self.readers.items()}

    # -- views --------------------------------------------------------------
    def split(self, name: str) -> DatasetView:
        """The view of split ``name`` (``train``/``val``/``test`` or a custom name)."""
        view = self._views.get(name)
        if view is None:
            self.manifest.chunks(name)  # raises KeyError naming the splits
            view = self._views[name] = DatasetView(self.context, self.planner, name, dataset=self)
        return view

    @property
    def train(self) -> DatasetView:
        return self.split("train")

    @property
    def val(self) -> DatasetView:
        return self.split("val")

    @property
    def test(self) -> DatasetView:
        return self.split("test")

    @property
    def all(self) -> DatasetView:
        """Every chunk of the store, whatever its split, in storage order: a deterministic sequential view."""
        view = self._views.get(ALL_SPLIT)
        if view is None:
            view = self._views[ALL_SPLIT] = DatasetView(self.context, self.planner, ALL_SPLIT, dataset=self)
        return view

    @property
    def geometries(self) -> dict[str, ArrayGeometry]:
        """Each label's geometry after chunk transforms (what ``batch.arrays[label]`` rows are)."""
        return dict(self.outputs)

    @property
    def epoch(self) -> int:
        return self.context.epoch

    @property
    def bad_chunks(self) -> list[BadChunkRecord]:
        """Tiles replaced under ``on_bad_chunk="nan"`` in the current epoch's passes."""
        return self.context.bad_chunks

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next passes draw (order depends on seed and epoch only)."""
        self.context.set_epoch(positive_int("epoch", epoch, minimum=0))

    def plan(self, split: str, epoch: int | None = None, history: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
        """This rank's (cached) plan of ``split`` for ``epoch`` (default: the current one).

        ``history`` lists ``(world_size, batches)`` segments of the epoch
        already consumed by an earlier run (elastic resume).
        """
        return self.planner.plan(split, self.epoch if epoch is None else epoch, history)

    def infer(
        self,
        sample_range: tuple[int, int] | None = None,
        *,
        start: Any = None,
        stop: Any = None,
        batch_size: int | None = None,
    ) -> InferView:
        """A sequential, deterministic pass over anchors ``[start, stop)``, across splits.

        ``sample_range`` is ``(start, stop)`` anchor indices; ``start=``/``stop=``
        select by the sample axis's coordinate instead, both inclusive like
        ``.sel(time=slice(start, stop))`` (dates, or numbers for a numeric
        coordinate; either may be left out). With neither, every anchor whose
        window fits the arrays. Unlike training, an anchor whose window would
        read off an array is an error, not a dropped sample. Each batch carries
        ``coords``: the sample-axis coordinate values of its anchors (or the
        anchors themselves when the store has no coordinate array for that axis).

        Raises
        ------
        ValueError
            The range is empty, outside the array, or a label's window
            (``anchor + offset``) would leave its array (the message names the
            label and the valid range); indices and coordinates both given, or
            coordinates without a coordinate array to match them.
        TimeAxisError
            An anchor wants a time the archive does not store, or one the manifest declares missing (named).
        TypeError
            A ``start``/``stop`` of the wrong kind (no date, or no number).
        """
        self._check_open()
        anchors = inference_range(self.manifest, self.outputs, self.variables.values(), sample_range, start, stop)
        bs = self.batch_size if batch_size is None else positive_int("batch_size", batch_size)
        return InferView(self.context, self.planner, anchors, bs, dataset=self)

    def sample_coords(self) -> dict[str, np.ndarray]:
        """The sample-axis coordinate values (decoded), read once from the store when the dataset opened (or indices)."""
        return self._coords

    # -- cost before the first byte --------------------------------------------
    def describe(self, iterations: int = 1) -> dict[str, Any]:
        """What this configuration will cost, from metadata alone, as a JSON-able dict (nothing is fetched).

        Geometry per label, the resolved knobs, every split's samples, batches, working set (this rank's share)
        and the GETs its first pass sends (shard indexes included), ``open``: the GETs and bytes sent as the
        dataset opened, apart; the memory plan term by term for ``iterations`` passes open at once (train and
        val zipped is 2), sized for the split with the largest working set; notes; ``concurrency``.
        """
        iterations = positive_int("iterations", iterations)
        plans = {name: self.plan(name) for name in self.manifest.names}
        split = max(plans, key=lambda name: plans[name].working_set_bytes)
        info = describe_loader(
            {lb: self.readers[g.source].geometry for lb, g in self.variables.items()},  # the stored arrays
            plans,
            {k: getattr(self, k) for k in KNOBS},
            split=split,
            store=type(self.store).__name__,
            iterations=iterations,
            budget_bytes=self.pool.explicit_budget,
            batch_geometries=self.outputs,
            empty={n: why for n, p in plans.items() if (why := self.planner.empty_reason(n, p)) is not None},
            **self.context.reads_report(plans),  # each split's GETs, the open's apart, the shard index budget
            statics=self.static_fields,
            left_out=self.left_out,
            remote=self.context.client() is not None,
            client=route_report(self.context.client()),  # which HTTP client reads the store, and why
            manifest=self.manifest,  # its quarantined chunks are a note
            losses=self.planner.losses(),  # each split's anchors lost to its times
        )
        info["resolved"] = {
            **{k: getattr(self, k) for k in RESOLVED},
            "cache_dir": None if self.cache is None else str(self.cache.cache_dir),
            "persist": self.persist,
            "chunk_transforms": len(self.chunk_transforms),
            "batch_transforms": len(self.batch_transforms),
        }
        info["read_group"] = self.read_group.describe(self.read_group_bands)
        shares = store_shares(self.store, plans, {s: (r.geometry.path, r.n_tiles) for s, r in self.readers.items()})
        if shares is not None:  # a store of several: each one's share of the reads
            info["stores"] = shares
        return {**info, "concurrency": _concurrency(self.context)}  # the reads-in-flight limit, as chosen

    def print_summary(self, iterations: int = 1) -> None:
        """Print :meth:`describe` as the text ``insitubatch inspect`` shows."""
        print(format_summary(self.describe(iterations)))

    # -- counters -------------------------------------------------------------
    @property
    def cache_hits(self) -> int:
        """Reads served from the pool (no fetch, no decode) in the current epoch's passes."""
        return sum(c.hits for c in self.context.epoch_counters)

    @property
    def cache_misses(self) -> int:
        return sum(c.misses for c in self.context.epoch_counters)

    @property
    def gets(self) -> int:
        """Store GETs issued by the current epoch's passes."""
        return sum(c.gets for c in self.context.epoch_counters)

    # -- lifecycle -------------------------------------------------------------
    def _check_open(self) -> None:
        self.context.check_open()

    def close(self) -> None:
        """Stop every open pass, drop the pool, and close a store this dataset opened. Idempotent."""
        closing_deferred()  # what datasets nobody closed left for a user's thread to close (``lifecycle``)
        if self.context.closed:
            return
        self.context.close()
        if self.cache is not None:
            self.cache.close()
        if self._opened_store:
            close_store(self.store)
        closed(self)  # the last open dataset's close gives the process's hooks back (``lifecycle``)

    def __enter__(self) -> InSituDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # a finalizer starts no thread, loop or I/O (``lifecycle``): it closes in full only where that is safe
        context = self.__dict__.get("context")  # absent when __init__ failed before making it
        if context is not None and not context.closed:
            later = [] if self.cache is None else [self.cache.close]
            if self._opened_store:
                later.append(functools.partial(close_store, self.store))
            dropped(self.close, context.release, later)
