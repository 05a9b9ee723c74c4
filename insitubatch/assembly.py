"""``DatasetParts``: what an ``InSituDataset`` is built from, composed in one place.

The dataset's constructor is the public door (its table checks every
argument); this factory is the composition root behind it. From arguments
the door already checked it resolves the variables and statics against the
store, opens the disk cache, and builds what every pass shares: the readers,
the ``ChunkPool``, the batch buffers, the decode pool, the ``PassContext``
and the ``EpochPlanner``. It trusts its inputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from zarr.abc.store import Store

from ._engine.loop import decode_pool
from ._engine.passes.context import BatchTransform, OnBadChunk, PassContext, read_sources
from ._engine.pool.buffers import BufferPool
from ._engine.pool.chunk_pool import ChunkPool
from ._engine.reads.reader import ArrayReader
from .cache import CacheOptions, open_dataset_cache
from .cache.disk import DiskCache
from .cache.fingerprint import array_fingerprints
from .io.geometry import ArrayGeometry
from .io.group import resolve_statics, resolve_variables
from .io.sources.joined import JoinedStore
from .io.statics import StaticField
from .plan.anchors import with_declared_times
from .plan.distributed import LastBatch, Remainder, last_batch_policy, resolve_last_batch, resolve_world
from .plan.planner import EpochPlanner
from .plan.read_groups import ReadGroup, read_group
from .plan.splits import SplitManifest
from .stores.obstore_stores import as_store
from .stores.reading import reading_store
from .transforms import ChunkTransform, check_scopes

__all__ = ["DatasetParts"]


@dataclass(frozen=True)
class DatasetParts:
    """The objects one dataset holds, built together by :meth:`assemble`."""

    store: Store
    opened_store: bool  # the dataset opened ``store`` from a URL/path, so closes it
    manifest: SplitManifest  # with the declared missing dates and frequency
    variables: dict[str, ArrayGeometry]
    left_out: dict[str, str]  # what ``variables=None`` left out of the store, with why
    static_fields: dict[str, StaticField]
    readers: dict[str, ArrayReader]
    outputs: dict[str, ArrayGeometry]
    cache: DiskCache | None
    pool: ChunkPool
    buffers: BufferPool
    decode_threads: int
    rank: int
    world_size: int
    last_batch: LastBatch  # resolved for the number of model replicas
    read_group: ReadGroup  # this rank's model-parallel read group
    read_group_bands: dict[str, slice]  # this member's part of every sample
    context: PassContext
    planner: EpochPlanner

    @classmethod
    def assemble(
        cls,
        store: Any,
        manifest: SplitManifest,
        variables: Mapping[str, ArrayGeometry] | Sequence[str] | None,
        statics: Mapping[str, StaticField] | Sequence[str] | None,
        *,
        batch_size: int,
        shuffle: bool,
        block_chunks: int,
        seed: int,
        max_inflight: int | Literal["auto"],
        prefetch_depth: int,
        cache_budget_bytes: int | None,
        on_bad_chunk: OnBadChunk,
        chunk_transforms: Sequence[ChunkTransform],
        batch_transforms: Sequence[BatchTransform],
        decode_threads: int | None,
        hedge: bool,
        rank: int | None,
        world_size: int | None,
        last_batch: LastBatch | None,
        remainder: Remainder | None,
        cache_options: CacheOptions,
        missing: Sequence[Any] | None,
        frequency: str | np.timedelta64 | None,
        read_group_size: Any,
        read_group_part: str | Sequence[Mapping[Any, Any]] | None,
        sample_coords: Callable[[], dict[str, np.ndarray]],
    ) -> DatasetParts:
        """Resolve the arguments against the store and build every part; ``sample_coords`` is the dataset's."""
        rank, world_size = resolve_world(rank, world_size)
        group = read_group(read_group_size, read_group_part, rank, world_size)
        last_batch = last_batch_policy(last_batch, remainder)
        opened_store = not hasattr(store, "get") or not hasattr(store, "set")
        store = as_store(store)
        left_out: dict[str, str] = {}
        if isinstance(store, JoinedStore):  # variables of several stores, on the anchor store's dates
            variables = store.resolve(variables, manifest.n_samples)
            statics_found = store.resolve_statics(statics)
        else:
            variables, left_out = resolve_variables(store, variables, manifest.n_samples)
            statics_found = resolve_statics(store, statics)
        bands = group.bands(variables)
        variables = group.cut(variables, bands)
        manifest = with_declared_times(manifest, variables, missing, frequency)
        static_fields = group.cut(statics_found, bands)
        check_distinct_labels(static_fields, variables)
        check_scopes(chunk_transforms, {g.path for g in variables.values()})
        readers, outputs = read_sources(variables, chunk_transforms)

        def fingerprints() -> dict[str, str]:
            # each read source's chunk-transform fingerprint: its array path's (a selection changes the name, not it)
            by_path = array_fingerprints(chunk_transforms, {r.geometry.path for r in readers.values()})
            return {source: by_path[r.geometry.path] for source, r in readers.items()}

        cache = open_dataset_cache(cache_options, fingerprints=fingerprints, store=store)
        # an entry the pool evicts leaves the disk cache's accounting too
        pool = ChunkPool(cache_budget_bytes, on_evict=None if cache is None else lambda e: cache.evict(*e.key))
        buffers = BufferPool()
        executor = decode_pool(decode_threads)
        threads = decode_threads if decode_threads is not None else (os.cpu_count() or 1)
        context = PassContext(
            # the engine reads through the store's own reader; a store insitubatch did not build is adapted here,
            # once, and the dataset closes the adapter (the engine's connections), never the store it adapts
            store=reading_store(store),
            readers=readers,
            outputs=outputs,
            offsets={lb: g.offset for lb, g in variables.items()},
            windows={lb: g.window_steps for lb, g in variables.items() if g.window_steps},
            pool=pool,
            buffers=buffers,
            executor=executor,
            max_inflight=max_inflight,
            decode_threads=threads,
            prefetch_depth=prefetch_depth,
            on_bad_chunk=on_bad_chunk,
            cache=cache,
            persist=cache_options.persist,
            batch_transforms=batch_transforms,
            sample_coords=sample_coords,
            hedge=hedge,
        )
        planner = EpochPlanner(
            manifest=manifest,
            outputs=outputs,
            batch_size=batch_size,
            block_chunks=block_chunks,
            shuffle=shuffle,
            seed=seed,
            rank=group.replica,  # the epoch is dealt to model replicas: a read group's members read alike
            world_size=group.replicas,
            last_batch=last_batch,
            release_per_block=cache_options.persist,
            variables=variables,
        )
        return cls(
            store=store,
            opened_store=opened_store,
            manifest=manifest,
            variables=variables,
            left_out=left_out,
            static_fields=static_fields,
            readers=readers,
            outputs=outputs,
            cache=cache,
            pool=pool,
            buffers=buffers,
            decode_threads=threads,
            rank=rank,
            world_size=world_size,
            last_batch=resolve_last_batch(last_batch, group.replicas),
            read_group=group,
            read_group_bands=bands,
            context=context,
            planner=planner,
        )


def check_distinct_labels(statics: Mapping[str, Any], variables: Mapping[str, Any]) -> None:
    """A label names a variable or a static, never both (``batch.arrays`` and ``batch.statics`` share names)."""
    clash = sorted(set(statics) & set(variables))
    if clash:
        raise ValueError(f"labels {clash} name both a variable and a static; give each its own label")
