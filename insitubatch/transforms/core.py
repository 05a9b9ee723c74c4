"""Chunk-stage transform contract: ``DecodedChunk``, ``applies`` scoping, per-array pipelines.

A chunk transform takes and returns a ``DecodedChunk`` (one array, one
sample-axis chunk, sample axis first). It runs on the decode pool, before
gather and before the cache, so it is amortised over every sample of the
chunk. ``applies`` restricts a transform to named array paths.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..io.geometry import ArrayGeometry
from ..validation import Anything, IsCallable, Table, validate_params

__all__ = [
    "ChunkRead",
    "ChunkTransform",
    "DecodedChunk",
    "Scoped",
    "applies",
    "check_scopes",
    "output_geometry",
    "pipeline_for",
    "run_pipeline",
    "stage_outputs",
]


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

    def __getattr__(self, name: str):
        # output_inner and any other declared attribute belong to the wrapped transform
        if name in ("paths", "transform"):
            raise AttributeError(name)
        return getattr(self.transform, name)


# What ``applies`` accepts (``validation``)
APPLIES_PARAMETERS: Table = {
    "paths": [Anything("array paths: one str or a non-empty sequence, matched when the dataset is built")],
    "transform": [IsCallable()],
}


@validate_params(APPLIES_PARAMETERS)
def applies(paths: Sequence[str] | str, transform: ChunkTransform) -> Scoped:
    """Run ``transform`` only on chunks of the named zarr array paths (not labels).

    A name that matches no array raises when the dataset is built.
    """
    if isinstance(paths, str):
        paths = [paths]
    paths = tuple(str(p) for p in paths)
    if not paths:
        raise ValueError("applies() needs at least one array path")
    validate = getattr(transform, "validate_scope", None)
    if validate is not None:  # e.g. a StandardScaler checks it holds statistics for every named path
        validate(paths)
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


def _with_inner(geometry: ArrayGeometry, inner: Sequence[int], dtype: np.dtype) -> ArrayGeometry:
    """``geometry`` with its inner (field) axes and dtype replaced; the sample axis is kept.

    A selection is consumed (the new field is what the transform made of the
    selected block); the result still names the source its rows come from.
    """
    inner = [int(x) for x in inner]
    axis = min(geometry.sample_axis, len(inner))
    n, size = geometry.n_samples, geometry.sample_chunk_size
    shape = (*inner[:axis], n, *inner[axis:])
    stored = (*inner[:axis], size, *inner[axis:])
    return dataclasses.replace(
        geometry,
        shape=shape,
        chunks=stored,
        stored_chunks=stored,
        dtype=np.dtype(dtype),
        sample_axis=axis,
        selection=(),
        dimension_names=None,
        origin=geometry.source,
    )


def stage_outputs(
    pipeline: Sequence[ChunkTransform], geometry: ArrayGeometry
) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The ``(inner_shape, dtype)`` each transform of ``pipeline`` must produce, in order.

    A transform that declares ``output_inner(geometry) -> (inner_shape, dtype)``
    may reshape or recast, to an inner shape of any rank (axes dropped, added
    or reordered); every other one must preserve both. ``geometry`` is the
    selected view: a selection applies before the transforms.
    """
    out = []
    g = geometry
    for t in pipeline:
        declare = getattr(t, "output_inner", None)
        if declare is not None:
            inner, dtype = _declared(t, declare, g)
            if inner != g.inner_shape or dtype != g.dtype:
                g = _with_inner(g, inner, dtype)
        out.append((g.inner_shape, g.dtype))
    return out


def _declared(t: ChunkTransform, declare: Callable, geometry: ArrayGeometry) -> tuple[tuple[int, ...], np.dtype]:
    """``t.output_inner(geometry)`` as ``(inner_shape, dtype)``; anything else raises naming the transform and array.

    The inner shape may have any rank (axes dropped, added or reordered):
    only the sample axis, kept first by the engine, is not the transform's.
    """
    where = f"chunk transform {_name(t)}.output_inner(geometry) for array {geometry.path!r}"
    try:
        inner, dtype = declare(geometry)
        inner = tuple(operator.index(x) for x in inner)
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where} must return (inner_shape, dtype), a tuple of ints and a numpy dtype: {exc}") from exc
    if any(x < 0 for x in inner):
        raise ValueError(f"{where} returned inner_shape {inner}; every extent must be >= 0")
    if dtype.hasobject:
        raise ValueError(f"{where} returned dtype {dtype}; only fixed-size dtypes can be gathered and cached")
    return inner, dtype


def output_geometry(geometry: ArrayGeometry, pipeline: Sequence[ChunkTransform]) -> ArrayGeometry:
    """What the engine stores and gathers for ``geometry`` after its chunk transforms."""
    stages = stage_outputs(pipeline, geometry)
    if not stages or (stages[-1][0] == geometry.inner_shape and stages[-1][1] == geometry.dtype):
        return geometry
    return _with_inner(geometry, *stages[-1])


def run_pipeline(
    pipeline: Sequence[ChunkTransform],
    chunk: DecodedChunk,
    expected: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None,
) -> np.ndarray:
    """Apply ``pipeline`` to ``chunk``, checking each stage's output shape and dtype.

    The sample axis length may never change; inner shape and dtype may only
    change as a transform's ``output_inner`` declares (``expected``). An
    exception a transform raises propagates as it is (a bug in user code is
    not bad data, so ``on_bad_chunk="nan"`` never hides it), with a note
    naming the transform, the array and the chunk.
    """
    n = chunk.data.shape[0]
    for k, t in enumerate(pipeline):
        before = chunk.data.shape
        try:
            out = t(chunk)
        except Exception as exc:
            exc.add_note(f"in chunk transform {_name(t)} on array {chunk.read.array!r} chunk {chunk.read.chunk_index}")
            raise
        if not isinstance(out, DecodedChunk):
            raise TypeError(f"chunk transform {_name(t)} returned {type(out).__name__}, not a DecodedChunk")
        chunk = out
        data = chunk.data
        if not isinstance(data, np.ndarray):
            raise TypeError(f"chunk transform {_name(t)} set data to {type(data).__name__}, not a numpy array")
        if data.ndim == 0 or data.shape[0] != n:
            raise ValueError(
                f"chunk transform {_name(t)} changed the sample axis of {chunk.read.array!r} "
                f"chunk {chunk.read.chunk_index} from {n} to {data.shape[0] if data.ndim else 'a scalar'}; "
                f"only inner axes may change"
            )
        if expected is not None:
            inner, dtype = expected[k]
            if data.shape[1:] != inner or data.dtype != dtype:
                made = (
                    f"chunk transform {_name(t)} turned {chunk.read.array!r} chunk {chunk.read.chunk_index} "
                    f"from {before} into {data.shape} {data.dtype}"
                )
                if hasattr(t, "output_inner"):
                    raise ValueError(
                        f"{made}, but its output_inner declares inner {inner} {dtype}, so the engine expected "
                        f"{(n, *inner)} {dtype}; make output_inner(geometry) return the inner shape and dtype "
                        f"the transform makes"
                    )
                raise ValueError(
                    f"{made}, but it declares no output_inner and the engine expected {(n, *inner)} {dtype}; "
                    f"declare output_inner(geometry) -> (inner_shape, dtype) for a reshape"
                )
    return np.ascontiguousarray(chunk.data)


def _name(t: object) -> str:
    inner = t.transform if isinstance(t, Scoped) else t
    return getattr(inner, "__qualname__", None) or type(inner).__qualname__
