"""The one module that touches zarr-python's internals, for every supported zarr line.

insitubatch shares zarr's store-IO event loop, decodes chunks with zarr's own
codec objects outside its async pipeline, and reaches inside a few stores.
None of that is public zarr API, so it lives here and nowhere else: the rest
of the package imports these names and calls these functions, and a zarr
release that moves an internal breaks this file only, with an error naming
the zarr version instead of an ``AttributeError`` deep in a decode thread.

Lines and what differs between them:

* **zarr 3.1-3.2** — codecs wrapped from numcodecs (``zarr.codecs.numcodecs``)
  have no synchronous decode; they are run through the numcodecs codec they
  carry. ``ArrayV3Metadata.get_chunk_spec`` exists.
* **zarr 3.3-3.4** — those wrappers gained ``_decode_sync``, metadata lost
  ``get_chunk_spec`` (chunk specs come from the chunk grid), and zarr has a
  synchronous chain (``zarr.core.chunk_utils.ChunkTransform``, itself still
  internal). It is not used: ``python -m bench.compat_decode`` puts it level
  with insitubatch's chain on 1 MB chunks (within the noise) and a few
  microseconds ahead on 64 KB ones, and it would skip the checks
  ``insitubatch.io.decode`` runs between stages (blosc frame headers that would
  make c-blosc read past a truncated chunk, decoded sizes, shard index bounds).

What stays the same on every line is written once: the chunk spec is built
from the metadata's dtype and fill value, and a wrapped numcodecs codec is
called directly on every line (one fewer buffer wrapper than zarr's own
``_decode_sync`` where that exists).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, MutableMapping
from typing import Any, TypeVar

import numpy as np
import zarr
from numcodecs.compat import ensure_ndarray_like
from zarr.abc.codec import ArrayArrayCodec, BytesBytesCodec
from zarr.abc.store import Store
from zarr.storage import MemoryStore, WrapperStore

__all__ = [
    "bytes_codec_endian",
    "ArrayConfig",
    "ArraySpec",
    "ArrayV2Metadata",
    "ArrayV3Metadata",
    "ChunkProjection",
    "chunk_spec",
    "codec_decoder",
    "io_loop",
    "memory_store_dict",
    "numcodec_behind",
    "running_io_loop",
    "scratch_store",
    "shard_index_at_start",
    "sync",
    "unwrap_store",
    "wrapped_numcodec",
]

# The zarr range .ci/run tests (its oldest and newest lines); the dependency
# pin in pyproject.toml says the same.
TESTED_ZARR = ((3, 1), (3, 4))
_TESTED = f"{TESTED_ZARR[0][0]}.{TESTED_ZARR[0][1]}-{TESTED_ZARR[-1][0]}.{TESTED_ZARR[-1][1]}"


def _gone(what: str) -> str:
    return (
        f"insitubatch needs zarr's internal {what}, which zarr {zarr.__version__} does not have; "
        f"insitubatch is tested with zarr {_TESTED}: pip install 'zarr>=3.1,<3.5'"
    )


try:
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.indexing import ChunkProjection
    from zarr.core.metadata.v2 import ArrayV2Metadata
    from zarr.core.metadata.v3 import ArrayV3Metadata
    from zarr.core.sync import sync as _zarr_sync
except ImportError as _exc:  # pragma: no cover - only on an unsupported zarr
    raise ImportError(_gone(f"module layout ({_exc})")) from _exc

T = TypeVar("T")


def sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on zarr's IO loop from synchronous code and return its result."""
    return _zarr_sync(coro)


def io_loop() -> asyncio.AbstractEventLoop:
    """zarr's process-wide store-IO event loop (started on first use, on its own thread)."""
    import zarr.core.sync as zsync

    get_loop = getattr(zsync, "_get_loop", None)
    if get_loop is None:
        raise RuntimeError(_gone("zarr.core.sync._get_loop (the store-IO event loop)"))
    return get_loop()


def running_io_loop() -> asyncio.AbstractEventLoop | None:
    """zarr's store-IO loop if it has been started and still runs, else None: never starts one."""
    import zarr.core.sync as zsync

    slot = getattr(zsync, "loop", None)
    if not isinstance(slot, list):
        raise RuntimeError(_gone("zarr.core.sync.loop (the store-IO event loop's slot)"))
    loop = slot[0] if slot else None
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    return loop


def chunk_spec(
    metadata: ArrayV2Metadata | ArrayV3Metadata, shape: tuple[int, ...], config: ArrayConfig, prototype: Any
) -> ArraySpec:
    """The ``ArraySpec`` a codec chain sees for one stored chunk of ``shape``.

    Built from the metadata's dtype and fill value, which is what every zarr
    line does (3.1's ``get_chunk_spec``, 3.4's chunk grid), so one path serves all.
    """
    return ArraySpec(
        shape=shape, dtype=metadata.dtype, fill_value=metadata.fill_value, config=config, prototype=prototype
    )


def wrapped_numcodec(codec: Any) -> Any:
    """The numcodecs codec a ``zarr.codecs.numcodecs`` wrapper carries, else None."""
    try:
        inner = getattr(codec, "_codec", None)
    except Exception:  # a wrapper whose codec cannot be built: not one we can run
        return None
    return inner if hasattr(inner, "decode") and hasattr(inner, "get_config") else None


def bytes_codec_endian(codec: Any) -> str | None:
    """The ``bytes`` codec's byte order as ``"little"``/``"big"``, or None (single-byte dtypes).

    zarr 3.1 holds an ``Endian`` enum; later lines may hold the plain string.
    """
    endian = codec.endian
    return None if endian is None else str(getattr(endian, "value", endian))


# zarr's built-in compressors build their numcodecs codec lazily under these attribute names
_BUILTIN_NUMCODEC_ATTRS = ("_zstd_codec", "_blosc_codec", "_gzip_codec")


def numcodec_behind(codec: Any) -> Any:
    """The numcodecs codec doing a zarr codec's work (a built-in's or a wrapper's), else ``codec`` itself.

    A built-in whose numcodecs codec cannot be built returns None: no direct decode goes through it.
    """
    for name in _BUILTIN_NUMCODEC_ATTRS:
        try:
            inner = getattr(codec, name, None)
        except Exception:  # a cached property that cannot be built
            return None
        if inner is not None:
            return inner
    return wrapped_numcodec(codec) or codec


def codec_decoder(codec: Any) -> Callable[[np.ndarray, ArraySpec], np.ndarray]:
    """One codec's decode as a plain ``numpy -> numpy`` call, with no event loop.

    Raises
    ------
    TypeError
        The codec has neither a synchronous decode nor a numcodecs codec inside.
    """
    from zarr.buffer.cpu import Buffer as CpuBuffer
    from zarr.buffer.cpu import NDBuffer as CpuNDBuffer

    numcodec = wrapped_numcodec(codec)
    if numcodec is not None:
        if isinstance(codec, BytesBytesCodec):
            return lambda a, spec: ensure_ndarray_like(numcodec.decode(a)).reshape(-1).view(np.uint8)
        return lambda a, spec: ensure_ndarray_like(numcodec.decode(a)).reshape(spec.shape)
    decode = getattr(codec, "_decode_sync", None)
    if decode is None:
        raise TypeError(
            f"codec {codec!r} has no synchronous decode (_decode_sync) in zarr {zarr.__version__} "
            "and wraps no numcodecs codec"
        )
    if isinstance(codec, ArrayArrayCodec):
        return lambda a, spec: decode(CpuNDBuffer.from_numpy_array(a), spec).as_numpy_array()
    return lambda a, spec: decode(CpuBuffer.from_array_like(a), spec).as_numpy_array()


def shard_index_at_start(codec: Any) -> bool:
    """Whether a ``ShardingCodec`` keeps its index before the inner chunks.

    zarr 3.1 holds ``index_location`` as an enum; 3.4 holds the plain string
    and deprecates the enum's members, so the value is compared as text.
    """
    location = codec.index_location
    return str(getattr(location, "value", location)) == "start"


def unwrap_store(store: Store) -> Store:
    """The store inside any stack of ``WrapperStore`` (zarr keeps it in ``_store``)."""
    while isinstance(store, WrapperStore):
        inner = getattr(store, "_store", None)
        if inner is None:
            raise RuntimeError(_gone("WrapperStore._store (the wrapped store)"))
        store = inner
    return store


def wrapper_stack(store: Store) -> list[Store]:
    """``store`` and each store inside it, outermost first, through any stack of ``WrapperStore``."""
    stack = [store]
    while isinstance(stack[-1], WrapperStore):
        inner = getattr(stack[-1], "_store", None)
        if inner is None:
            raise RuntimeError(_gone("WrapperStore._store (the wrapped store)"))
        stack.append(inner)
    return stack


def scratch_store(contents: MutableMapping[str, Any] | None = None) -> tuple[MemoryStore, MutableMapping[str, Any]]:
    """A zarr ``MemoryStore`` over ``contents`` (key -> Buffer) and that mapping: room to run zarr's codecs in.

    zarr keeps the mapping it is given (its documented ``store_dict``), so what
    zarr writes is read back from the mapping without reaching into the store.
    """
    data: MutableMapping[str, Any] = {} if contents is None else contents
    return MemoryStore(data), data


def memory_store_dict(store: MemoryStore) -> MutableMapping[str, Any]:
    """A ``MemoryStore``'s backing dict of key -> Buffer (zarr keeps it in ``_store_dict``)."""
    data = getattr(store, "_store_dict", None)
    if data is None:
        raise RuntimeError(_gone("MemoryStore._store_dict (the store's contents)"))
    return data
