"""Test helpers: store wrappers that count, delay and fail; dataset writers."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import json
import os
import subprocess
import tempfile
import threading
import time
import warnings
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.buffer import Buffer, BufferPrototype
from zarr.abc.store import ByteRequest, Store
from zarr.errors import ZarrUserWarning
from zarr.storage import WrapperStore

# how often a held GET looks whether the store was released
HOLD_POLL_S = 0.002


class CountingStore(WrapperStore):
    """Counts GETs per key and the peak number in flight; optionally sleeps per GET.

    ``fail_keys`` raise ``OSError`` on GET (a store outage for those keys).
    ``hold(after=n)`` parks every GET after the next ``n`` until
    ``release()``: fetches stay in flight for as long as a test needs them to.
    """

    def __init__(self, store: Store, *, latency_s: float = 0.0, fail_keys: set[str] | None = None) -> None:
        super().__init__(store)
        self.latency_s = latency_s
        self.fail_keys = set(fail_keys or ())
        self.gets: Counter[str] = Counter()
        self.inflight = 0
        self.peak_inflight = 0
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._passes = 0  # GETs still let through while held
        self._allow: frozenset[str] = frozenset()  # keys whose GETs are let through while held

    def hold(self, after: int = 0, allow: frozenset[str] = frozenset()) -> None:
        """Park GETs until ``release()``: all but the next ``after``, and never those of the keys in ``allow``."""
        with self._lock:
            self._passes = after
            self._allow = frozenset(allow)
            self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _let_through(self, key: str) -> bool:
        with self._lock:
            if self._open.is_set() or key in self._allow:
                return True
            if self._passes > 0:
                self._passes -= 1
                return True
            return False

    def _with_store(self, store: Store) -> CountingStore:  # zarr calls this for read-only copies
        return type(self)(store, latency_s=self.latency_s, fail_keys=self.fail_keys)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        with self._lock:
            self.gets[key] += 1
            self.inflight += 1
            self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            if not self._let_through(key):
                while not self._open.is_set():
                    await asyncio.sleep(HOLD_POLL_S)
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
        return Counter(
            {
                k: v
                for k, v in self.gets.items()
                if not k.endswith(("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"))
            }
        )

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


def write_array(root: zarr.Group, name: str, data: np.ndarray, chunks, *, shards=None, dims=None, **kw) -> zarr.Array:
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


def sockets_to(port: int) -> int:
    """This process's established TCP connections to loopback ``port`` (from /proc, not the client's books)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor, too)
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes and int(fields[2].split(":")[1], 16) == port and fields[3] == "01":
            count += 1
    return count


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def put_chunk(cache, path: str, chunk: int, tile: np.ndarray) -> bool:
    """Write a one-tile chunk through ``DiskCache.begin``/``write``/``commit``; False when ``begin`` declined it."""
    handle = cache.begin(path, chunk, 1, tile.shape, tile.dtype)
    if handle is None:
        return False
    cache.write(handle, 0, tile)
    cache.commit(handle, [tile.shape])
    return True


def cache_log_entries(cache_dir: Path) -> list[dict]:
    """Every complete entry line of a persisted cache: its base log, then each writer's segment (headers left out)."""
    files = [Path(cache_dir) / "insitu_cache.jsonl", *sorted((Path(cache_dir) / "insitu_cache.d").glob("*.jsonl"))]
    entries = []
    for f in files:
        if f.exists():
            lines = f.read_bytes().split(b"\n")[1:-1]  # the header, and an unterminated (torn) final line, out
            entries += [json.loads(line) for line in lines]
    return entries


@functools.cache
def can_mount_tmpfs() -> bool:
    """Whether this process may mount a tmpfs (root with CAP_SYS_ADMIN): tried once, on a scratch directory."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as scratch:
        try:
            with small_tmpfs(Path(scratch), "64k"):
                return True
        except (OSError, subprocess.CalledProcessError):
            return False


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str):
    """A real filesystem of ``size`` bytes (a tmpfs) mounted at the existing directory ``where``."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True, capture_output=True)
    try:
        yield where
    finally:  # lazily: a view a test still holds keeps its mapping until it dies
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


class FullAfter:
    """``os.posix_fallocate`` that reserves the first ``n`` files, then fails ``ENOSPC`` like a full disk.

    Installed with ``monkeypatch.setattr(os, "posix_fallocate", FullAfter(n))``:
    the tile-file write path of the disk cache (``tilefile.create_tile_file``).
    """

    def __init__(self, n: int) -> None:
        self.left = n
        self.failed = 0
        self._real = os.posix_fallocate
        self._lock = threading.Lock()

    def __call__(self, fd: int, offset: int, length: int) -> None:
        with self._lock:
            full = self.left <= 0
            self.left -= 1
            self.failed += full
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real(fd, offset, length)


def shard_keys(g, tiles, chunks) -> list[str]:
    """The shard keys sample-axis chunks ``chunks`` (in order) read for tiles ``tiles``, each once, in first use.

    The test's own reckoning from the geometry: a tile's shard is its stored-chunk coordinate.
    """
    axis = g.sample_axis
    per = [s // c for s, c in zip(g.stored_chunks, g.tile_chunks)]
    inner = per[:axis] + per[axis + 1 :]
    field = sorted({tuple(c // p for c, p in zip(g.tile_coord(t), inner)) for t in tiles})
    keys: dict[str, None] = {}
    for c in chunks:
        row = int(c) // per[axis]
        keys.update(dict.fromkeys(g.chunk_key((*f[:axis], row, *f[axis:])) for f in field))
    return list(keys)


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


class EvictionWatch:
    """Weak references to the tiles of every entry a pool evicts, to prove nothing else keeps them.

    Install it as the pool's ``on_evict`` (chaining the one already there):
    ``alive()`` lists evicted tiles some object other than the pool still references, and
    ``holders()`` names who does, for an assertion message.
    """

    def __init__(self, pool) -> None:
        self.evicted = 0
        self._refs: list[tuple[tuple, weakref.ref]] = []
        self._pool = pool
        self._chained = pool.on_evict
        pool.on_evict = self._on_evict
        self._take = pool.take_tile
        pool.take_tile = self._take_tile

    def _take_tile(self, shape, dtype):
        """A recycled tile handed out again starts a new life: stop watching it."""
        tile = self._take(shape, dtype)
        with self._pool.lock:  # _on_evict appends under it
            self._refs = [(key, ref) for key, ref in self._refs if ref() is not tile]
        return tile

    def _on_evict(self, entry) -> None:
        if self._chained is not None:
            self._chained(entry)
        self.evicted += 1
        self._refs.extend((entry.key, weakref.ref(t)) for t in entry.tiles if t is not None)

    def alive(self) -> list[tuple[tuple, np.ndarray]]:
        """Evicted tiles still alive other than in the pool's own hands.

        The pool recycles an evicted tile nobody references: it sits in its
        free list until a decode takes it again, and is no leak.
        """
        pool = self._pool
        with pool.lock:
            recycled = {id(t) for t in pool.free}
        return [(key, t) for key, ref in self._refs if (t := ref()) is not None and id(t) not in recycled]

    def holders(self) -> str:
        """The types of the objects that still reference the first live evicted tile (and theirs)."""
        live = self.alive()
        if not live:
            return "none"
        key, tile = live[0]
        lines = [f"tile of {key}:"]
        for ref in gc.get_referrers(tile):
            if ref is live:
                continue
            lines.append(
                f"  {type(ref).__name__} <- "
                + ", ".join(type(r).__name__ for r in gc.get_referrers(ref) if r is not lines)
            )
        return "\n".join(lines)


def write_tiled_and_sharded(store: Any, shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    """A consolidated group at ``store`` (a zarr store or a path): ``v`` in 2 x 2 tiles and ``s`` sharded; values by name."""
    rng = np.random.default_rng(seed)
    group = zarr.open_group(store, mode="w")
    write_array(group, "v", smooth_field(rng, shape), (4, 3, 8))
    write_array(group, "s", smooth_field(rng, shape), (2, 3, 8), shards=(4, 6, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(group.store)
    written = zarr.open_group(store, mode="r")
    return {name: written[name][...] for name in ("v", "s")}


def run_gloo_ranks(args: list[str], world: int, timeout_s: float) -> list[int | None]:
    """Run ``world`` processes of ``args`` as the ranks of one torch gloo group on loopback; their exit codes.

    A rank that fails leaves the others waiting for it: every rank still
    running when the first wait ends is killed, so none outlives the test.
    """
    from servers import free_port

    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen(args, env=env))
    deadline = time.monotonic() + timeout_s
    try:
        return [p.wait(timeout=max(0.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        return [p.poll() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
