"""Chunk-stage transform contract: ``DecodedChunk``, ``applies`` scoping, per-array pipelines.

A chunk transform takes and returns a ``DecodedChunk`` (one array, one
sample-axis chunk, sample axis first). It runs on the decode pool, before
gather and before the cache, so it is amortised over every sample of the
chunk. ``applies`` restricts a transform to named array paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ChunkRead", "DecodedChunk", "Scoped", "applies", "pipeline_for", "run_pipeline"]


@dataclass(frozen=True)
class ChunkRead:
    """Which chunk a ``DecodedChunk`` holds: array path and global sample-axis chunk index."""

    array: str
    chunk_index: int


@dataclass
class DecodedChunk:
    """One decoded chunk: ``data`` is ``(n_samples_in_chunk, *inner)``, sample axis first.

    ``sample_offset`` is the global sample index of ``data[0]``.
    """

    read: ChunkRead
    data: np.ndarray
    sample_offset: int


ChunkTransform = Callable[[DecodedChunk], DecodedChunk]


@dataclass(frozen=True)
class Scoped:
    """A chunk transform restricted to some array paths (see ``applies``)."""

    paths: tuple[str, ...]
    transform: ChunkTransform

    def __call__(self, chunk: DecodedChunk) -> DecodedChunk:
        return self.transform(chunk)

    @property
    def cache_key(self) -> str | None:
        return getattr(self.transform, "cache_key", None)


def applies(paths: Sequence[str] | str, transform: ChunkTransform) -> Scoped:
    """Run ``transform`` only on chunks of the named zarr array paths (not labels).

    A name that matches no array raises when the dataset is built.
    """
    if isinstance(paths, str):
        paths = [paths]
    paths = tuple(str(p) for p in paths)
    if not paths:
        raise ValueError("applies() needs at least one array path")
    if not callable(transform):
        raise TypeError(f"transform must be callable, got {type(transform).__name__}")
    return Scoped(paths, transform)


def check_scopes(transforms: Iterable[ChunkTransform], known_paths: Iterable[str]) -> None:
    """Raise ``ValueError`` for an ``applies`` path that names no array of the dataset."""
    known = set(known_paths)
    for t in transforms:
        if isinstance(t, Scoped):
            unknown = [p for p in t.paths if p not in known]
            if unknown:
                raise ValueError(
                    f"applies({list(t.paths)}, ...) names {unknown}, which are not arrays of this dataset; "
                    f"arrays are {sorted(known)}"
                )
        elif not callable(t):
            raise TypeError(f"chunk_transforms entries must be callable, got {type(t).__name__}")


def pipeline_for(transforms: Sequence[ChunkTransform], path: str) -> tuple[ChunkTransform, ...]:
    """The transforms that run on ``path``'s chunks, in order (unscoped ones run everywhere)."""
    return tuple(t for t in transforms if not isinstance(t, Scoped) or path in t.paths)


def run_pipeline(pipeline: Sequence[ChunkTransform], chunk: DecodedChunk) -> np.ndarray:
    """Apply ``pipeline`` to ``chunk``; the sample axis length may never change."""
    n = chunk.data.shape[0]
    for t in pipeline:
        out = t(chunk)
        if not isinstance(out, DecodedChunk):
            raise TypeError(f"chunk transform {_name(t)} returned {type(out).__name__}, not a DecodedChunk")
        chunk = out
        if chunk.data.shape[0] != n:
            raise ValueError(
                f"chunk transform {_name(t)} changed the sample axis of {chunk.read.array!r} "
                f"chunk {chunk.read.chunk_index} from {n} to {chunk.data.shape[0]}; only inner axes may change"
            )
    return np.ascontiguousarray(chunk.data)


def _name(t: object) -> str:
    inner = t.transform if isinstance(t, Scoped) else t
    return getattr(inner, "__qualname__", None) or type(inner).__qualname__
