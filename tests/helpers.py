"""Test helpers: store wrappers that count, delay and fail; dataset writers."""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore


class CountingStore(WrapperStore):
    """Counts GETs per key and the peak number in flight; optionally sleeps per GET.

    ``fail_keys`` raise ``OSError`` on GET (a store outage for those keys).
    """

    def __init__(self, store: Store, *, latency_s: float = 0.0, fail_keys: set[str] | None = None) -> None:
        super().__init__(store)
        self.latency_s = latency_s
        self.fail_keys = set(fail_keys or ())
        self.gets: Counter[str] = Counter()
        self.inflight = 0
        self.peak_inflight = 0
        self._lock = threading.Lock()

    def _with_store(self, store: Store) -> CountingStore:  # zarr calls this for read-only copies
        return type(self)(store, latency_s=self.latency_s, fail_keys=self.fail_keys)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        with self._lock:
            self.gets[key] += 1
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if key in self.fail_keys:
                raise OSError(f"injected failure for {key}")
            return await self._store.get(key, prototype, byte_range)
        finally:
            with self._lock:
                self.inflight -= 1

    def chunk_gets(self) -> Counter[str]:
        """GETs of chunk keys only (metadata reads excluded)."""
        return Counter({k: v for k, v in self.gets.items() if not k.endswith(("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"))})

    def reset(self) -> None:
        with self._lock:
            self.gets.clear()
            self.peak_inflight = 0


def smooth_field(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "f4") -> np.ndarray:
    """Smooth values plus noise: compressible like real fields, never constant."""
    grids = np.meshgrid(*[np.linspace(0, 3, s) for s in shape], indexing="ij")
    base = sum(np.sin(g * (k + 1)) for k, g in enumerate(grids))
    data = base + 0.1 * rng.standard_normal(shape)
    if np.dtype(dtype).kind in "iu":
        return (data * 20).astype(dtype)
    return data.astype(dtype)


def write_array(
    root: zarr.Group, name: str, data: np.ndarray, chunks, *, shards=None, dims=None, **kw
) -> zarr.Array:
    kwargs = dict(shape=data.shape, chunks=chunks, dtype=data.dtype, **kw)
    if shards is not None:
        kwargs["shards"] = shards
    if dims is not None and root.metadata.zarr_format == 3:
        kwargs["dimension_names"] = dims
    arr = root.create_array(name, **kwargs)
    arr[...] = data
    if dims is not None and root.metadata.zarr_format == 2:
        arr.attrs["_ARRAY_DIMENSIONS"] = list(dims)
    return arr


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def local_store(path: Path, read_only: bool = True) -> Store:
    return zarr.storage.LocalStore(str(path), read_only=read_only)


def assert_batch_matches(batch, variables, data) -> None:
    """Every label of ``batch`` equals ``data[path]`` (the zarr-python read of the whole array) at its rows.

    ``variables`` is the dataset's ``{label: ArrayGeometry}``; ``data`` maps an
    array path to its values with the sample axis first.
    """
    assert len(batch) > 0
    for label, g in variables.items():
        expected = data[g.path][batch.read_indices(label)]
        np.testing.assert_array_equal(batch.arrays[label], expected, err_msg=f"label {label!r} of batch {batch.index}")
