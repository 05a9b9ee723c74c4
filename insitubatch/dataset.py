"""``InSituDataset``: splits of a zarr store as iterable views of shuffled batches.

A pass (one iteration of a view) is an owner in the dataset's ``ChunkPool``:
its driver fetches on zarr's loop while a producer thread waits each block
its next batch draws from, gathers the batch in C, runs batch transforms,
and hands it over through a bounded queue. Leaving the loop early stops the
producer and cancels this pass's tasks; nothing outlives the pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import zarr
import zarr.errors

from .batch import Batch, BufferPool
from .cache import DiskCache
from .errors import DatasetClosedError
from .gather import gather_label
from .geometry import ArrayGeometry, open_geometries
from .distributed import REMAINDER_POLICIES, rank_streams, resolve_world
from .plan import EpochPlan, build_plan, epoch_order, valid_anchor_range
from .pool import FAILED, PENDING, ChunkPool, Owner, PassCounters
from .scheduler import ArrayReader, BadChunkRecord, PassDriver, decode_pool, zarr_loop
from .splits import SplitManifest
from .stores import as_store, close_store
from .fingerprint import array_fingerprints
from .transforms import ChunkTransform, check_scopes, pipeline_for

__all__ = ["DatasetView", "InSituDataset"]

logger = logging.getLogger("insitubatch")
BatchTransform = Callable[[Batch], Batch]
ON_BAD_CHUNK = ("raise", "nan")
# how often a blocked producer or consumer re-checks for a stop or a dead peer
POLL_S = 0.05


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    # bool("false") is True: a string or a number here is a mistake, not a flag
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")
    return bool(value)


def _callables(name: str, value: Any) -> tuple:
    """A sequence of callables as a tuple; one bare callable is a mistake worth naming."""
    if callable(value) or isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a list of callables, got {type(value).__name__} ({value!r}); "
            f"wrap a single transform in a list: {name}=[t]"
        )
    for i, t in enumerate(value):
        if not callable(t):
            raise TypeError(f"{name}[{i}] must be callable, got {type(t).__name__} ({t!r})")
    return tuple(value)


class InSituDataset:
    """Train/val/test views over a zarr store, read in place.

    Parameters
    ----------
    store
        A zarr ``Store``, or a URL/path (opened read-only with ``obstore_store``).
        Fault tolerance is the store's: ``obstore_store(url, retry=...,
        client_options=...)`` retries transient failures and times out stalls
        (its defaults are ``stores.DEFAULT_RETRY`` and
        ``stores.DEFAULT_CLIENT_OPTIONS``). What still fails reaches the
        consumer as ``StoreReadError`` naming array, chunk and key; a missing
        chunk key reads as the fill value.
    manifest
        The ``SplitManifest`` whose chunk grid is the anchor grid.
    variables
        ``{label: ArrayGeometry}`` (a ``shift(k)`` view is a windowed label),
        a list of array paths (labels = paths), or ``None`` for every data
        variable ``open_geometries`` finds.
    batch_size, shuffle, block_chunks, seed
        Batches per step; whether ``train`` is shuffled (``val``/``test`` are
        always sequential); chunks per shuffle block; the order's seed.
    max_inflight
        Stored-chunk fetches in flight at once, across every pass of this dataset.
    prefetch_depth
        Batches the producer assembles ahead of the consumer.
    cache_budget_bytes
        Pool byte budget; ``None`` is the working set of the open passes.
    on_bad_chunk
        ``"raise"`` or ``"nan"`` (a tile that fails to decode becomes NaN or
        the fill value, and is listed in ``bad_chunks``).
    chunk_transforms, batch_transforms
        Per-chunk transforms (decode pool, cached) and per-batch ones (producer thread).
    decode_threads
        Threads of the process-wide decode pool (default: one per core).
    rank, world_size
        This process's share of each epoch. Unset: from an initialized
        ``torch.distributed`` group, else ``RANK``/``WORLD_SIZE``, else 0 of 1.
    remainder
        How a multi-rank training pass evens out batch counts: ``"pad"``
        repeats a rank's own samples, ``"drop"`` cuts to the shortest rank
        (see ``insitubatch.distributed``).
    cache_dir
        Back the pool with mmap'd tile-major ``.npy`` slot files here (local
        NVMe). One writing process per directory (an advisory lock).
    persist
        Keep slot files and log each completed chunk, so later runs revive
        them without fetching or decoding. Windowed shuffled passes then
        release each block's chunks and revive them from disk when needed.
    reset_stale_cache
        Rebuild the arrays whose chunk transforms changed instead of raising.
    readonly_cache
        Share a warmed cache with other readers; a chunk it lacks raises.
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
        max_inflight: int = 32,
        prefetch_depth: int = 2,
        cache_budget_bytes: int | None = None,
        seed: int = 0,
        on_bad_chunk: str = "raise",
        chunk_transforms: Sequence[ChunkTransform] = (),
        batch_transforms: Sequence[BatchTransform] = (),
        decode_threads: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        remainder: str = "pad",
        cache_dir: str | os.PathLike | None = None,
        persist: bool = False,
        reset_stale_cache: bool = False,
        readonly_cache: bool = False,
    ) -> None:
        if not isinstance(manifest, SplitManifest):
            raise TypeError(f"manifest must be a SplitManifest (from split_by_chunk), got {type(manifest).__name__}")
        self.batch_size = _positive_int("batch_size", batch_size)
        self.block_chunks = _positive_int("block_chunks", block_chunks)
        self.max_inflight = _positive_int("max_inflight", max_inflight)
        self.prefetch_depth = _positive_int("prefetch_depth", prefetch_depth)
        self.seed = _positive_int("seed", seed, minimum=0)
        if decode_threads is not None:
            decode_threads = _positive_int("decode_threads", decode_threads)
        if on_bad_chunk not in ON_BAD_CHUNK:
            raise ValueError(f"on_bad_chunk={on_bad_chunk!r} must be one of {ON_BAD_CHUNK}")
        if cache_budget_bytes is not None:
            cache_budget_bytes = _positive_int("cache_budget_bytes", cache_budget_bytes)
        self.shuffle = _flag("shuffle", shuffle)
        persist = _flag("persist", persist)
        reset_stale_cache = _flag("reset_stale_cache", reset_stale_cache)
        readonly_cache = _flag("readonly_cache", readonly_cache)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a directory path (str or os.PathLike) or None, got "
                            f"{type(cache_dir).__name__} ({cache_dir!r})")
        self.rank, self.world_size = resolve_world(rank, world_size)
        if remainder not in REMAINDER_POLICIES:
            raise ValueError(f"remainder={remainder!r} must be one of {REMAINDER_POLICIES}")
        self.remainder = remainder
        self.on_bad_chunk = on_bad_chunk
        self.manifest = manifest
        self._opened_store = not hasattr(store, "get") or not hasattr(store, "set")
        self.store = as_store(store)
        self.variables = self._resolve_variables(variables)
        self.chunk_transforms = _callables("chunk_transforms", chunk_transforms)
        check_scopes(self.chunk_transforms, {g.path for g in self.variables.values()})
        self.batch_transforms = _callables("batch_transforms", batch_transforms)
        self.readers: dict[str, ArrayReader] = {}
        for g in self.variables.values():
            if g.path not in self.readers:
                base = g.shift(-g.offset)
                self.readers[g.path] = ArrayReader.build(base, pipeline_for(self.chunk_transforms, g.path))
        # what slots hold and batches carry: each label's geometry after its chunk transforms
        self.outputs = {lb: self.readers[g.path].output.shift(g.offset - self.readers[g.path].output.offset)
                        for lb, g in self.variables.items()}
        self.cache = self._open_cache(cache_dir, persist, reset_stale_cache, readonly_cache)
        self.persist = bool(persist)
        self.pool = ChunkPool(cache_budget_bytes, on_evict=self._evicted if self.cache is not None else None)
        self._warned_epochs: set[int] = set()
        self.buffers = BufferPool()
        self.executor = decode_pool(decode_threads)
        self._semaphore: asyncio.Semaphore | None = None
        self.bad_chunks: list[BadChunkRecord] = []
        self._epoch = 0
        self._epoch_counters: list[PassCounters] = []
        self._passes: weakref.WeakSet[_PassState] = weakref.WeakSet()
        self._plans: dict[tuple[str, int], EpochPlan] = {}
        self._views: dict[str, DatasetView] = {}
        self._coords: dict[str, np.ndarray] | None = None
        self._closed = False
        self._lock = threading.Lock()

    # -- construction helpers ---------------------------------------------------
    def _resolve_variables(self, variables) -> dict[str, ArrayGeometry]:
        if variables is None:
            found = open_geometries(self.store)
            if not found:
                raise ValueError("the store has no data variables (only coordinates or nothing); pass variables=")
            resolved = dict(found)
        elif isinstance(variables, Mapping):
            resolved = {}
            for label, g in variables.items():
                if not isinstance(g, ArrayGeometry):
                    raise TypeError(
                        f"variables[{label!r}] must be an ArrayGeometry (from open_geometries), got {type(g).__name__}"
                    )
                resolved[str(label)] = g
        elif isinstance(variables, (list, tuple)):
            resolved = dict(open_geometries(self.store, variables=list(variables)))
        else:
            raise TypeError(
                f"variables must be a mapping of label to ArrayGeometry, a list of array paths, or None; "
                f"got {type(variables).__name__}"
            )
        if not resolved:
            raise ValueError("variables is empty: name at least one array")
        n = self.manifest.n_samples
        bad = {lb: g.n_samples for lb, g in resolved.items() if g.n_samples != n}
        if bad:
            raise ValueError(
                f"every variable must have the manifest's {n} samples along its sample axis; "
                f"these differ: {bad}"
            )
        return resolved

    def _open_cache(self, cache_dir, persist, reset_stale, readonly) -> DiskCache | None:
        if cache_dir is None:
            if persist or readonly or reset_stale:
                raise ValueError(
                    f"persist={persist}, readonly_cache={readonly}, reset_stale_cache={reset_stale} need a cache_dir"
                )
            return None
        if readonly and not persist:
            raise ValueError("readonly_cache=True reads a persisted cache: pass persist=True with it")
        fingerprints = array_fingerprints(self.chunk_transforms, list(self.readers))
        return DiskCache(cache_dir, persist=bool(persist), readonly=bool(readonly), fingerprints=fingerprints,
                         reset_stale=bool(reset_stale))

    def _evicted(self, slot) -> None:
        self.cache.evict(*slot.key)

    def _warn_if_cache_useless(self, counters: PassCounters, epoch: int) -> None:
        """One WARNING per epoch when a persisted cache was consulted, rejected entries, and served nothing."""
        cache = self.cache
        if cache is None or not self.persist or counters.hits or epoch in self._warned_epochs:
            return
        rejected = cache.rejected
        if sum(rejected.values()):
            self._warned_epochs.add(epoch)
            logger.warning(
                "insitubatch: the persisted cache in %s served no chunk this epoch although it holds entries; "
                "rejected: %s (a changed array shape/dtype or output_inner makes entries misses)",
                cache.cache_dir, dict(rejected),
            )

    # -- views --------------------------------------------------------------
    def split(self, name: str) -> DatasetView:
        """The view of split ``name`` (``train``/``val``/``test`` or a custom name)."""
        view = self._views.get(name)
        if view is None:
            self.manifest.chunks(name)  # raises KeyError naming the splits
            view = self._views[name] = DatasetView(self, name)
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
    def geometries(self) -> dict[str, ArrayGeometry]:
        """Each label's geometry after chunk transforms (what ``batch.arrays[label]`` rows are)."""
        return dict(self.outputs)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next passes draw (order depends on seed and epoch only)."""
        epoch = _positive_int("epoch", epoch, minimum=0)
        with self._lock:
            if epoch != self._epoch:
                self._epoch_counters = []
            self._epoch = epoch

    def plan(self, split: str, epoch: int | None = None, history: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
        """This rank's (cached) plan of ``split`` for ``epoch`` (default: the current one).

        ``history`` lists ``(world_size, batches)`` segments of the epoch
        already consumed by an earlier run (elastic resume).
        """
        epoch = self._epoch if epoch is None else epoch
        key = (split, epoch, tuple(history))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(split, epoch, tuple(history), None, self.batch_size)
            if len(self._plans) > 8:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _make_plan(self, split, epoch, history, anchor_range, batch_size) -> EpochPlan:
        manifest = self.manifest
        shuffle = self.shuffle and split == "train"
        if split not in manifest.names:  # an inference range: its own sequential "split"
            size = manifest.sample_chunk_size
            chunks = tuple(range(anchor_range[0] // size, -(-anchor_range[1] // size)))
            manifest = dataclasses.replace(manifest, splits=((split, chunks),))
        if self.world_size == 1 and not history:
            eo = epoch_order(manifest, split, self.outputs, block_chunks=self.block_chunks, shuffle=shuffle,
                             seed=self.seed, epoch=epoch, anchor_range=anchor_range)
            return build_plan(manifest, self.outputs, eo.order, eo.block_starts, batch_size,
                              release_per_block=self.persist)
        eo = epoch_order(manifest, split, self.outputs, block_chunks=self.block_chunks, shuffle=shuffle,
                         seed=self.seed, epoch=epoch, anchor_range=anchor_range)
        streams = rank_streams(eo, self.world_size, batch_size=batch_size, remainder=self.remainder,
                               contiguous=split != "train", history=history)
        mine = streams[self.rank]
        padded = mine.padded if mine.padded.any() else None
        return build_plan(manifest, self.outputs, eo.order[mine.rows], mine.block_starts, batch_size, padded=padded,
                          release_per_block=self.persist)

    def infer(self, sample_range: tuple[int, int] | None = None, *, batch_size: int | None = None) -> InferView:
        """A sequential, deterministic pass over anchors ``[start, stop)``, across splits.

        ``None`` means every anchor whose window fits the arrays. Unlike
        training, an anchor whose window would read off an array is an error,
        not a dropped sample. Each batch carries ``coords``: the sample-axis
        coordinate values of its anchors (or the anchors themselves when the
        store has no coordinate array for that axis).

        Raises
        ------
        ValueError
            The range is empty, outside the array, or a label's window
            (``anchor + offset``) would leave its array; the message names the
            label and the valid range.
        """
        self._check_open()
        lo, hi = valid_anchor_range(self.manifest, self.outputs)
        n = self.manifest.n_samples
        if sample_range is None:
            start, stop = lo, hi
            if start >= stop:
                raise ValueError(f"no anchor has every window inside the arrays (valid range would be [{lo}, {hi}))")
        else:
            try:
                start, stop = (int(v) for v in sample_range)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"sample_range={sample_range!r} must be a (start, stop) pair of ints") from exc
            if not 0 <= start < stop <= n:
                raise ValueError(f"sample_range={(start, stop)} must satisfy 0 <= start < stop <= {n}")
            for label, g in self.outputs.items():
                if start + g.offset < 0 or stop - 1 + g.offset >= n:
                    raise ValueError(
                        f"label {label!r} reads anchor + {g.offset}, so sample_range={(start, stop)} would read "
                        f"[{start + g.offset}, {stop + g.offset}) off its array of {n} samples; "
                        f"anchors with every window inside the arrays are [{lo}, {hi})"
                    )
        bs = self.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
        return InferView(self, (start, stop), bs)

    def sample_coords(self) -> dict[str, np.ndarray]:
        """The sample-axis coordinate values, read once from the store (or the indices)."""
        if self._coords is None:
            self._coords = _read_sample_coords(self.store, self.variables, self.manifest.n_samples)
        return self._coords

    # -- counters -------------------------------------------------------------
    @property
    def cache_hits(self) -> int:
        """Reads served from the pool (no fetch, no decode) in the current epoch's passes."""
        return sum(c.hits for c in self._epoch_counters)

    @property
    def cache_misses(self) -> int:
        return sum(c.misses for c in self._epoch_counters)

    @property
    def gets(self) -> int:
        """Store GETs issued by the current epoch's passes."""
        return sum(c.gets for c in self._epoch_counters)

    # -- lifecycle -------------------------------------------------------------
    def _semaphore_for_loop(self) -> asyncio.Semaphore:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_inflight)
        return self._semaphore

    def _check_open(self) -> None:
        if self._closed:
            raise DatasetClosedError("this InSituDataset is closed; create a new one to iterate again")

    def close(self) -> None:
        """Stop every open pass, drop the pool, and close a store this dataset opened. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for state in list(self._passes):
            state.close()
        self.pool.clear()
        self.buffers.clear()
        if self.cache is not None:
            self.cache.close()
        if self._opened_store:
            close_store(self.store)

    def __enter__(self) -> InSituDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter teardown
        try:
            self.close()
        except Exception:
            pass


STATE_FORMAT = 1


class DatasetView:
    """One split of a dataset: iterate it for batches; ``len()`` is batches this epoch.

    ``state_dict()``/``load_state_dict()`` make a pass resumable: a new
    process that loads the state yields exactly the batches the first one
    would have yielded next, and fetches only what those batches need.
    """

    def __init__(self, dataset: InSituDataset, split: str) -> None:
        self.dataset = dataset
        self.split = split
        self._pass: weakref.ref[_PassState] | None = None
        # (epoch, batch, history) where the next pass starts, set by load_state_dict
        self._resume_at: tuple[int, int, tuple[tuple[int, int], ...]] | None = None

    @property
    def batch_size(self) -> int:
        return self.dataset.batch_size

    @property
    def geometries(self) -> dict[str, ArrayGeometry]:
        """Each label's geometry after chunk transforms (batch rows are ``(*inner_shape,)`` of ``dtype``)."""
        return self.dataset.geometries

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def plan(self) -> EpochPlan:
        return self.dataset.plan(self.split)

    def __len__(self) -> int:
        return self.plan().n_batches

    def __iter__(self) -> Iterator[Batch]:
        start, history = 0, ()
        if self._resume_at is not None:
            epoch, start, history = self._resume_at
            self._resume_at = None
            self.dataset.set_epoch(epoch)
        return self.iterate(start, history=history)

    def iterate(self, start_batch: int = 0, *, history: tuple[tuple[int, int], ...] = ()) -> PassIterator:
        """Start a pass at batch ``start_batch`` of the current epoch."""
        ds = self.dataset
        ds._check_open()
        start_batch = _positive_int("start_batch", start_batch, minimum=0)
        state = _PassState(ds, self.split, self._plan_for_pass(history), ds.epoch, start_batch)
        state.history = history
        ds._passes.add(state)
        self._pass = weakref.ref(state)
        state.start()
        return PassIterator(state)

    def _plan_for_pass(self, history: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
        return self.dataset.plan(self.split, history=history)

    # -- resume -------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        ds = self.dataset
        return {
            "split": self.split,
            "seed": ds.seed,
            "batch_size": ds.batch_size,
            "block_chunks": ds.block_chunks,
            "shuffle": ds.shuffle,
            "manifest": ds.manifest.fingerprint(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this view stands: a small JSON-able dict (epoch, batches consumed, identity).

        All ranks of a job consume in lockstep, so one rank's state describes
        the job; ``world_size`` and ``history`` let a different world size resume it.
        """
        history: tuple[tuple[int, int], ...] = ()
        if self._resume_at is not None:
            epoch, consumed, history = self._resume_at
        else:
            state = self._pass() if self._pass is not None else None
            if state is not None and state.epoch == self.dataset.epoch:
                epoch, consumed, history = state.epoch, state.consumed, state.history
            else:
                epoch, consumed = self.dataset.epoch, 0
        return {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "batches_consumed": consumed,
            "world_size": self.dataset.world_size,
            "history": [list(h) for h in history],
            **self._identity(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next pass starts at the saved epoch and batch.

        Raises
        ------
        ValueError
            The state came from a different split, seed, batch size, block
            size, shuffle setting or manifest (each named), or is malformed.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping from state_dict(), got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"state['format']={state.get('format')!r} is not the supported {STATE_FORMAT}; "
                "pass a dict that state_dict() returned"
            )
        mine = self._identity()
        diffs = [f"{k}: saved {state.get(k)!r}, this dataset has {v!r}" for k, v in mine.items() if state.get(k) != v]
        if diffs:
            raise ValueError("cannot resume from a state of a different pass: " + "; ".join(diffs))
        epoch = _positive_int("state['epoch']", state.get("epoch"), minimum=0)
        consumed = _positive_int("state['batches_consumed']", state.get("batches_consumed"), minimum=0)
        saved_world = _positive_int("state['world_size']", state.get("world_size", 1))
        try:
            history = tuple((int(w), int(k)) for w, k in state.get("history", ()))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"state['history']={state.get('history')!r} must be a list of [world_size, batches]") from exc
        if saved_world != self.dataset.world_size:
            # another world size: the consumed part becomes history, the rest is dealt anew
            if consumed:
                history = (*history, (saved_world, consumed))
            consumed = 0
        else:
            saved_n = self.dataset.plan(self.split, epoch, history).n_batches
            if consumed > saved_n:
                raise ValueError(f"state['batches_consumed']={consumed} exceeds the {saved_n} batches of epoch {epoch}")
        self._resume_at = (epoch, consumed, history)


class InferView(DatasetView):
    """A sequential pass over an anchor range, across splits; batches carry ``coords``."""

    def __init__(self, dataset: InSituDataset, sample_range: tuple[int, int], batch_size: int) -> None:
        super().__init__(dataset, "__infer__")
        self.sample_range = sample_range
        self._batch_size = batch_size
        self._plan: EpochPlan | None = None

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def plan(self) -> EpochPlan:
        if self._plan is None:
            self._plan = self.dataset._make_plan(self.split, 0, (), self.sample_range, self._batch_size)
        return self._plan

    def _plan_for_pass(self, history: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
        return self.plan()

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "batch_size": self._batch_size, "sample_range": list(self.sample_range)}


def _read_sample_coords(store: Any, variables: Mapping[str, ArrayGeometry], n: int) -> dict[str, np.ndarray]:
    """The sample axis's coordinate array (by dimension name) when the store has one, else indices."""
    for g in variables.values():
        dims = g.dimension_names
        name = dims[g.sample_axis] if dims else None
        if not name:
            continue
        parent = g.path.rsplit("/", 1)[0] if "/" in g.path else ""
        for path in ([f"{parent}/{name}"] if parent else []) + [name]:
            try:
                arr = zarr.open_array(store=store, path=path, mode="r")
            except (FileNotFoundError, KeyError, ValueError, TypeError, zarr.errors.NodeTypeValidationError):
                continue
            if arr.ndim == 1 and arr.shape[0] == n:
                return {name: np.asarray(arr[...])}
    return {"sample": np.arange(n)}


_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Stopped(Exception):
    """The pass was closed while the producer waited."""


class _PassState:
    """Everything one pass owns: pool owner, driver, producer thread, queue."""

    def __init__(self, ds: InSituDataset, split: str, plan: EpochPlan, epoch: int, start_batch: int) -> None:
        if not 0 <= start_batch <= plan.n_batches:
            raise ValueError(f"{start_batch=} must be in [0, {plan.n_batches}] for split {split!r}")
        self.ds = ds
        self.split = split
        self.plan = plan
        self.epoch = epoch
        self.start_batch = start_batch
        self.queue: queue.Queue = queue.Queue(maxsize=ds.prefetch_depth)
        self.stop_event = threading.Event()
        self.owner: Owner | None = None
        self.driver: PassDriver | None = None
        self.thread: threading.Thread | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self.consumed = start_batch
        self.history: tuple[tuple[int, int], ...] = ()
        self.coords = ds.sample_coords() if split == "__infer__" else None
        release_order = np.argsort(plan.read_last, kind="stable")
        bounds = np.searchsorted(plan.read_last[release_order], np.arange(plan.n_blocks + 1))
        self.release_after = [release_order[bounds[b] : bounds[b + 1]].tolist() for b in range(plan.n_blocks)]

    @property
    def counters(self) -> PassCounters:
        return self.owner.counters if self.owner is not None else PassCounters()

    def _first_block(self) -> int:
        """The block of the first row this pass yields (reads used only before it are skipped)."""
        plan = self.plan
        if self.start_batch >= plan.n_batches:
            return plan.n_blocks
        return plan.batch_blocks(self.start_batch)[0]

    def start(self) -> None:
        ds = self.ds
        self.owner = ds.pool.open_owner(self.plan.working_set_bytes, self.plan.read_ahead_bound)
        with ds._lock:
            ds._epoch_counters.append(self.owner.counters)
        self.driver = PassDriver(
            store=ds.store, pool=ds.pool, owner=self.owner, plan=self.plan, readers=ds.readers,
            semaphore=ds._semaphore_for_loop(), executor=ds.executor, on_bad_chunk=ds.on_bad_chunk,
            bad_chunks=ds.bad_chunks, first_block=self._first_block(), cache=ds.cache,
        )
        self.driver.start()
        self.thread = threading.Thread(target=self._produce, name="insitu-prefetch", daemon=True)
        self.thread.start()

    # -- producer thread ----------------------------------------------------------
    def _produce(self) -> None:
        try:
            self._produce_batches()
            self._put(_END)
        except _Stopped:
            pass
        except BaseException as exc:  # delivered to the consumer, raised there
            self._put(_Failure(exc))

    def _put(self, item: object) -> None:
        while not self.stop_event.is_set():
            try:
                self.queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue
        raise _Stopped

    def _wait_block(self, b: int) -> None:
        pool, driver = self.ds.pool, self.driver
        wanted = self.plan.block_reads[b]
        with pool.cond:
            while True:
                if self.stop_event.is_set():
                    raise _Stopped
                if driver.error is not None:
                    raise driver.error
                pending = False
                for i in wanted:
                    slot = driver.slots[i]
                    if slot is None or slot.state == PENDING:
                        pending = True
                        break
                    if slot.state == FAILED:
                        raise slot.error
                if not pending:
                    return
                pool.cond.wait(POLL_S)

    def _release_block(self, b: int) -> None:
        for i in self.release_after[b]:
            slot = self.driver.slots[i]
            if slot is not None:
                self.ds.pool.unpin(slot, self.owner)

    def _produce_batches(self) -> None:
        ds, plan = self.ds, self.plan
        ready_upto = -1
        released_upto = -1
        if self.start_batch > 0:
            first_row = plan.batch_rows(self.start_batch)[0] if self.start_batch < plan.n_batches else plan.n_samples
            while released_upto + 1 < plan.n_blocks and plan.block_starts[released_upto + 2] <= first_row:
                released_upto += 1
                self._release_block(released_upto)
        for k in range(self.start_batch, plan.n_batches):
            start, stop = plan.batch_rows(k)
            b0, b1 = plan.batch_blocks(k)
            while ready_upto < b1:
                ready_upto += 1
                if ready_upto > released_upto:
                    self._wait_block(ready_upto)
            anchors = plan.anchors[start:stop]
            # the slots this batch's blocks read (a key may have one read per block when blocks release)
            slots = self.driver.slots
            held = {plan.reads[i]: slots[i] for b in range(b0, b1 + 1) for i in plan.block_reads[b]}
            arrays = {}
            for label, g in ds.outputs.items():
                shape = self._label_shape(label, g)
                buf = ds.buffers.take(label, (plan.batch_size, *shape[1:]), shape[0])
                out = buf[: len(anchors)]
                gather_label(out, anchors, g, lambda c, path=g.path: held[(path, c)])
                arrays[label] = out
            coords = None
            if self.coords is not None:
                coords = {name: values[anchors] for name, values in self.coords.items()}
            batch = Batch(
                arrays=arrays, sample_indices=anchors.copy(),
                offsets={lb: g.offset for lb, g in ds.variables.items()}, coords=coords, epoch=self.epoch, index=k,
            )
            if plan.padded is not None:
                batch.extras["padded"] = plan.padded[start:stop].copy()
            for t in ds.batch_transforms:
                batch = t(batch)
                if not isinstance(batch, Batch):
                    raise TypeError(f"batch transform {t!r} returned {type(batch).__name__}, not a Batch")
            counters = self.owner.counters
            counters.batches += 1
            counters.samples += len(anchors)
            # blocks whose last row is in this batch are drained: unpin their last-use reads
            while released_upto + 1 < plan.n_blocks and plan.block_starts[released_upto + 2] <= stop:
                released_upto += 1
                self._release_block(released_upto)
            self._put(batch)
            del batch, arrays, out, buf

    def _label_shape(self, label: str, g: ArrayGeometry) -> tuple[np.dtype, ...]:
        """``(dtype, *inner)`` of a label's batch rows after chunk transforms."""
        cache = getattr(self, "_shapes", None)
        if cache is None:
            cache = self._shapes = {}
        if label not in cache:
            cache[label] = (g.dtype, *g.inner_shape)  # g is the post-transform geometry
        return cache[label]

    # -- teardown ---------------------------------------------------------------
    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.stop_event.set()
        with self.ds.pool.cond:
            self.ds.pool.cond.notify_all()
        while True:  # unblock a producer parked on a full queue
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        if self.driver is not None:
            self.driver.stop()
        if self.owner is not None:
            self.ds.pool.close_owner(self.owner)


class PassIterator:
    """The consumer's end of a pass: pops finished batches; ``close()`` ends the pass early."""

    def __init__(self, state: _PassState) -> None:
        self._state = state
        self._finalizer = weakref.finalize(self, state.close)

    @property
    def counters(self) -> PassCounters:
        """This pass's own counters (hits, misses, GETs, batches)."""
        return self._state.counters

    @property
    def plan(self) -> EpochPlan:
        return self._state.plan

    def __iter__(self) -> PassIterator:
        return self

    def __next__(self) -> Batch:
        state = self._state
        while True:
            if state._closed:
                self._ended()
            try:
                item = state.queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                if state.thread is not None and not state.thread.is_alive() and state.queue.empty():
                    self.close()
                    self._ended()
        if item is _END:
            self.close()
            state.ds._warn_if_cache_useless(state.counters, state.epoch)
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        state.consumed += 1
        return item

    def _ended(self) -> None:
        """The pass is closed: a closed dataset is an error, a pass the caller closed simply ends."""
        if self._state.ds._closed:
            raise DatasetClosedError(
                "the InSituDataset was closed while this pass was open; its remaining batches are gone"
            ) from None
        raise StopIteration from None

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> PassIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
