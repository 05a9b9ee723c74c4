"""``InSituDataset``: a zarr store's splits as views of shuffled batches, read in place.

The constructor is the public door: ``PARAMETERS`` below is what each of
its arguments accepts (``validation``), and its docstring the options'
reference. ``DatasetParts.assemble`` (``assembly``) then builds, once, what
every pass shares: a ``PassContext`` (readers, the ``ChunkPool`` and its
disk cache, batch buffers, the decode pool, the read permits, the epoch's
counters) and an ``EpochPlanner``. Views (``views.py``) read only those
two to plan and start passes (``_engine/passes/producer.py``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ._engine.lifecycle import close_at_exit, closed, closing_deferred, dropped
from ._engine.passes.context import ON_BAD_CHUNK, BatchTransform, OnBadChunk
from ._engine.passes.context import concurrency_report as _concurrency
from ._engine.passes.warm import open_reads
from ._engine.reads.reader import BadChunkRecord
from ._engine.reads.store_link import route_report
from .assembly import DatasetParts
from .cache import CACHE_PARAMETERS, CacheOptions, OnCorrupt
from .io.geometry import ArrayGeometry, sample_coords
from .io.statics import StaticField, read_statics
from .plan.cost import KNOBS, describe_loader, format_summary
from .plan.dates import inference_range
from .plan.distributed import LAST_BATCH_POLICIES, LastBatch, Remainder
from .plan.epoch import EpochPlan
from .plan.splits import SplitManifest
from .plan.store_shares import store_shares
from .stores.owned import close_store
from .transforms import ChunkTransform
from .validation import Anything, Callables, Flag, Instance, Interval, Options, Table, validate_params
from .views import DatasetView, InferView

__all__ = ["InSituDataset"]

ALL_SPLIT = "__all__"  # the pseudo-split of ``ds.all``: every chunk, sequential
# settings ``describe()`` reports as resolved (after defaults and the environment), besides the knobs
RESOLVED = ("shuffle", "seed", "epoch", "rank", "world_size", "last_batch", "on_bad_chunk", "decode_threads")

# What each parameter of ``InSituDataset`` accepts (``validation``): one row per parameter, in the order checked.
# ``Anything`` rows are resolved against the store (or the manifest) by the function named, with its own messages.
PARAMETERS: Table = {
    "store": [Anything("as_store: a zarr Store, or a URL/path to open")],
    "manifest": [Instance(SplitManifest, "a SplitManifest (from split_by_chunk)")],
    "batch_size": [Interval(1)],
    "block_chunks": [Interval(1)],
    "max_inflight": [Options("auto"), Interval(1)],
    "hedge": [Flag()],
    "prefetch_depth": [Interval(1)],
    "seed": [Interval(0)],
    "decode_threads": [Interval(1), None],
    "on_bad_chunk": [Options(*ON_BAD_CHUNK)],
    "cache_budget_bytes": [Interval(1), None],
    "shuffle": [Flag()],
    **CACHE_PARAMETERS,  # cache_dir, persist, readonly_cache, reset_stale_cache, cache_disk_bytes, on_corrupt_cache
    "rank": [Interval(0), None],  # below world_size: resolve_world, which also reads torch, JAX or the environment
    "world_size": [Interval(1), None],
    "last_batch": [Options(*LAST_BATCH_POLICIES), None],
    "remainder": [Anything("last_batch_policy: the deprecated alias of last_batch, named with its replacement")],
    "variables": [Anything("resolve_variables: labels, geometries or paths, against the store's arrays")],
    "missing": [Anything("with_declared_times: dates of the sample axis")],
    "frequency": [Anything("with_declared_times: the anchors' spacing")],
    "read_group_size": [Anything("read_group: an int or a torch process group, dividing world_size"), None],
    "read_group_part": [Anything("read_group: a dimension to cut, or one isel mapping per member"), None],
    "statics": [Anything("resolve_statics: static fields or paths, against the store's arrays")],
    "chunk_transforms": [Callables()],
    "batch_transforms": [Callables()],
}
# What ``InSituDataset.infer`` accepts; the range, against the arrays and their coordinates: ``inference_range``
RANGE = [Anything("inference_range: anchor indices (start, stop), or coordinate bounds")]
INFER_PARAMETERS: Table = {"sample_range": RANGE, "start": RANGE, "stop": RANGE, "batch_size": [Interval(1), None]}


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

    @validate_params(PARAMETERS)
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
        cache_options = CacheOptions(  # the cache's settings together: their combinations are checked here
            cache_dir,
            persist=persist,
            readonly=readonly_cache,
            reset_stale=reset_stale_cache,
            disk_bytes=cache_disk_bytes,
            on_corrupt=on_corrupt_cache,
        )
        self.batch_size, self.block_chunks, self.shuffle, self.seed = batch_size, block_chunks, shuffle, seed
        self.max_inflight: int | Literal["auto"] = max_inflight
        self.prefetch_depth, self.hedge, self.on_bad_chunk = prefetch_depth, hedge, on_bad_chunk
        self.chunk_transforms, self.batch_transforms = chunk_transforms, batch_transforms
        self._coords: dict[str, np.ndarray] = {}  # the sample-axis coordinates, read below
        parts = DatasetParts.assemble(
            store,
            manifest,
            variables,
            statics,
            batch_size=batch_size,
            shuffle=shuffle,
            block_chunks=block_chunks,
            seed=seed,
            max_inflight=max_inflight,
            prefetch_depth=prefetch_depth,
            cache_budget_bytes=cache_budget_bytes,
            on_bad_chunk=on_bad_chunk,
            chunk_transforms=chunk_transforms,
            batch_transforms=batch_transforms,
            decode_threads=decode_threads,
            hedge=hedge,
            rank=rank,
            world_size=world_size,
            last_batch=last_batch,
            remainder=remainder,
            cache_options=cache_options,
            missing=missing,
            frequency=frequency,
            read_group_size=read_group_size,
            read_group_part=read_group_part,
            sample_coords=self.sample_coords,
        )
        self.store, self._opened_store, self.manifest = parts.store, parts.opened_store, parts.manifest
        self.variables, self.left_out, self.static_fields = parts.variables, parts.left_out, parts.static_fields
        self.readers, self.outputs, self.cache = parts.readers, parts.outputs, parts.cache
        self.persist = cache_options.persist
        self.pool, self.buffers, self.executor = parts.pool, parts.buffers, parts.context.executor
        self.decode_threads, self.rank, self.world_size = parts.decode_threads, parts.rank, parts.world_size
        self.last_batch: LastBatch = parts.last_batch
        self.read_group, self.read_group_bands = parts.read_group, parts.read_group_bands  # this member's part
        self.context, self.planner = parts.context, parts.planner
        self._views: dict[str, DatasetView] = {}
        close_at_exit(self)  # however the script ends, closed while zarr's loop still runs (``lifecycle``)
        try:  # read once here, not in a pass (whose GETs are the chunks')
            self._coords = open_reads(
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

    @validate_params({"epoch": [Interval(0)]})
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next passes draw (order depends on seed and epoch only)."""
        self.context.set_epoch(epoch)

    def plan(self, split: str, epoch: int | None = None, history: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
        """This rank's (cached) plan of ``split`` for ``epoch`` (default: the current one).

        ``history`` lists ``(world_size, batches)`` segments of the epoch
        already consumed by an earlier run (elastic resume).
        """
        return self.planner.plan(split, self.epoch if epoch is None else epoch, history)

    @validate_params(INFER_PARAMETERS)
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
        bs = self.batch_size if batch_size is None else batch_size
        return InferView(self.context, self.planner, anchors, bs, dataset=self)

    def sample_coords(self) -> dict[str, np.ndarray]:
        """The sample-axis coordinate values (decoded), read once from the store when the dataset opened (or indices)."""
        return self._coords

    # -- cost before the first byte --------------------------------------------
    @validate_params({"iterations": [Interval(1)]})
    def describe(self, iterations: int = 1) -> dict[str, Any]:
        """What this configuration will cost, from metadata alone, as a JSON-able dict (nothing is fetched).

        Geometry per label, the resolved knobs, every split's samples, batches, working set (this rank's share)
        and the GETs its first pass sends (shard indexes included), ``open``: the GETs and bytes sent as the
        dataset opened, apart; the memory plan term by term for ``iterations`` passes open at once (train and
        val zipped is 2), sized for the split with the largest working set; notes; ``concurrency``.
        """
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

    @validate_params({"iterations": [Interval(1)]})
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
        if self.context.store is not self.store:  # the door's adapter: the engine's connections, not the store
            self.context.store.close()
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
            if context.store is not self.store:
                later.append(context.store.close)
            dropped(self.close, context.release, later)
