"""``DiskCache``: the mmap tier of the chunk pool, optionally persisted and shared by many writers.

One ``DiskCache`` serves one dataset over one ``cache_dir``; any number of
them — DDP ranks, several jobs on one host — may write the same directory
at once. Every chunk is a tile-major ``.npy`` file (``tilefile.TileFile``)
written under a temporary name and renamed into place, so a file under its
final name is always complete, and a mapping another process holds keeps its
own inode.

Without ``persist`` the directory is spill space: each writer's files are
its own, unlinked on eviction and on close. With ``persist`` each writer
appends a line per completed chunk to its own log segment (``ledger``),
after the file is published; ``find`` revives any logged chunk — this
writer's, another live writer's, or an earlier run's — as zero-copy
read-only views. A chunk nobody logged is *claimed* (``claims``) before it
is fetched, so two writers never make it at once: a writer that finds it
claimed is told it is busy and looks again later, by which time it is
usually logged. What ``cache_dir`` holds is listed in ``files``; how
writers and readonly readers keep apart, in ``lock``.

The parts
---------
``DiskCache`` is the one face of collaborating parts, each holding the
others it needs, all sharing the cache's one lock: a ``CacheIndex``
(``index``: what the logs say, and opening the directory), ``HeldChunks``
(``held``: the mappings it holds), ``DiskSpace`` (``space``: whether it
still writes), ``Claims`` (``claims``), a ``CacheReader`` (``reading``:
``find``, ``lookup``) and a ``CacheWriter`` (``writing``: ``begin`` …
``commit``). Its settings are one checked ``CacheOptions`` (``options``).

Checksums
---------
Each log line carries the CRC-32C of its whole file. A revive verifies it
the first time this process maps that file (same name, inode, size and
mtime: verified once per process, at about 10 GB/s with the GIL released).
A file that fails — checksum, size, or an unreadable header — is
re-made from the store with one WARNING naming it, or raises
``CacheCorruptError`` with ``on_corrupt="raise"``.

A full disk, and a disk budget
------------------------------
``ENOSPC``/``EDQUOT`` while writing stops this cache writing, with one
WARNING naming the directory, the bytes and the free space: ``begin`` then
returns ``None`` and the engine keeps the chunk in memory (within its byte
budget) instead. ``disk_bytes`` caps the bytes the directory's logged tile
files and this writer's writes in progress take; a chunk that would pass it
is not written (``begin`` returns ``None``), which the engine reports once
per pass. Other writers' writes in progress are not seen, so with ``N``
writers the directory may pass the cap by what they have in flight.

Views and ``close()``
---------------------
``find``/``lookup`` and ``commit`` return read-only numpy views of a
``PROT_READ`` mapping. ``evict`` and ``close`` release the cache's hold on a
mapping; the bytes stay mapped while a view the caller kept is alive
(``munmap`` runs when the last one dies), so a view never dangles. The cache
holds no mapping and no file descriptor after ``close()``.
"""

from __future__ import annotations

import operator
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from zarr.abc.store import Store

from ..errors import CacheMissError
from .claims import Claims
from .files import WriteHandle, new_writer_token
from .fingerprint import is_fingerprint
from .held import HeldChunks
from .index import CacheIndex
from .lock import leave_directory, network_filesystem, release_fds, require_flock
from .log import Key, LogEntry
from .options import CacheOptions, OnCorrupt
from .reading import CacheReader, Found, Premapped
from .space import DiskSpace
from .writing import CacheWriter

__all__ = ["DiskCache", "open_dataset_cache"]


class DiskCache:
    """The mmap-backed chunk cache of one dataset over one ``cache_dir``.

    Parameters
    ----------
    cache_dir
        Directory of the tile files, the logs and the lock file; created for a
        writer. It is the dataset's identity: one directory per source dataset.
    persist
        Keep files across runs and log each completed chunk.
    readonly
        Open the cache only to read (needs ``persist=True``): no writer may
        run meanwhile, nothing is written, and a miss is the caller's to raise
        (``miss_error``).
    fingerprints
        ``{name: 16-hex pipeline fingerprint}`` of every array this run
        caches (``fingerprint.array_fingerprints``). A name is opaque: an
        array path, or a path with a selection suffix.
    reset_stale
        Delete the stale arrays' files and entries instead of raising (needs
        to be the only writer at that moment).
    disk_bytes
        Most bytes the directory's tile files may take (see the module
        docstring); ``None``: up to a full disk.
    on_corrupt
        A damaged tile file is re-made from the store with a WARNING
        (``"refetch"``) or raises ``CacheCorruptError`` (``"raise"``).

    Raises
    ------
    CacheLockedError
        Readers hold the directory (for a writer), writers do (for a reader),
        or a stale reset meets live writers; names their PIDs.
    CachePlatformError
        The platform has no ``flock``.
    CacheCorruptError
        A log is damaged (see ``log``).
    StaleCacheError
        Entries of arrays in ``fingerprints`` were made by other transforms.
    TypeError
        A flag that is not a bool, a ``disk_bytes`` that is not an int.
    ValueError
        A bad value or combination (``CacheOptions``), or a bad fingerprint.

    Warns
    -----
    UserWarning
        When ``cache_dir`` is on a network or FUSE filesystem, where ``flock``
        may not arbitrate between hosts.

    Notes
    -----
    Thread-safe: decode threads may ``find`` and ``write`` while the
    scheduler calls the other methods. The counters are this object's; the
    engine keeps per-pass ones.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        *,
        persist: bool,
        readonly: bool = False,
        fingerprints: Mapping[str, str],
        reset_stale: bool = False,
        disk_bytes: int | None = None,
        on_corrupt: OnCorrupt = "refetch",
    ) -> None:
        options = CacheOptions(
            cache_dir,
            persist=persist,
            readonly=readonly,
            reset_stale=reset_stale,
            disk_bytes=disk_bytes,
            on_corrupt=on_corrupt,
        )
        assert options.cache_dir is not None  # cache_dir is a required argument
        bad = {p: f for p, f in fingerprints.items() if not isinstance(p, str) or not is_fingerprint(f)}
        if bad:
            raise ValueError(f"fingerprints must map array paths to 16 lowercase hex digits; bad: {bad!r}")
        self.options = options
        self.cache_dir: Path = options.cache_dir
        require_flock(self.cache_dir)
        self.token = new_writer_token()
        self._lock = threading.RLock()
        self._fds: list[int] = []
        self._finalizer = weakref.finalize(self, release_fds, self._fds)
        self._space = DiskSpace(self.cache_dir, persist=options.persist, writes=not options.readonly)
        self._index = CacheIndex(options, fingerprints, space=self._space, fds=self._fds)
        self._held = HeldChunks(self.cache_dir)
        self._claims = Claims(self._index.shared_dir, self._fds)
        index, held, claims, space, lock = self._index, self._held, self._claims, self._space, self._lock
        self._reader = CacheReader(options, index=index, held=held, claims=claims, space=space, lock=lock)
        self._writer = CacheWriter(
            options,
            token=self.token,
            index=index,
            held=held,
            claims=claims,
            space=space,
            reader=self._reader,
            lock=lock,
        )
        self._made_dir = False

        if options.readonly:
            if not self.cache_dir.is_dir():
                raise FileNotFoundError(
                    f"readonly cache_dir {str(self.cache_dir)!r} does not exist; warm it with a writing run first"
                )
        else:
            self._made_dir = not self.cache_dir.exists()  # a spill cache removes what it made on close
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        fs = network_filesystem(self.cache_dir)
        if fs is not None:
            warnings.warn(
                f"cache_dir {str(self.cache_dir)!r} is on a {fs} filesystem, where flock may be per client: "
                "writers and readers on two hosts are not kept apart. Use a local disk for cache_dir.",
                UserWarning,
                stacklevel=2,
            )
        try:
            if options.readonly:
                self._index.open_as_reader()
            else:
                self._index.open_as_writer(self.token)
        except BaseException:
            self._finalizer()
            raise

    # -- settings -----------------------------------------------------------
    @property
    def persist(self) -> bool:
        return self.options.persist

    @property
    def readonly(self) -> bool:
        return self.options.readonly

    @property
    def disk_bytes(self) -> int | None:
        return self.options.disk_bytes

    @property
    def verify(self) -> bool:
        """Check each file's CRC-32C when first revived (the bench turns it off to measure it)."""
        return self._reader.verify

    @verify.setter
    def verify(self, value: bool) -> None:
        self._reader.verify = value

    # -- engine API: reading ------------------------------------------------
    def premap(self, keys: Sequence[tuple[str, int]]) -> Premapped:
        """Map the logged files of many chunks in one kernel call (``CacheReader.premap``)."""
        return self._reader.premap(keys)

    @staticmethod
    def close_premapped(premapped: Premapped) -> None:
        """Unmap the files ``premap`` mapped that no ``find`` took."""
        CacheReader.close_premapped(premapped)

    def lookup(
        self, path: str, chunk_index: int, tile_shapes: Sequence[Sequence[int]], dtype: npt.DTypeLike
    ) -> list[np.ndarray] | None:
        """The chunk's tiles as read-only zero-copy views, or ``None`` on a miss (``find`` without claiming)."""
        return self._reader.lookup(path, chunk_index, tile_shapes, dtype)

    def find(
        self,
        path: str,
        chunk_index: int,
        tile_shapes: Sequence[Sequence[int]],
        dtype: npt.DTypeLike,
        *,
        claim: bool = True,
        premapped: Premapped | None = None,
    ) -> Found:
        """Revive the chunk if any writer logged it; else, with ``claim``, claim it (``CacheReader.find``)."""
        return self._reader.find(path, chunk_index, tile_shapes, dtype, claim=claim, premapped=premapped)

    def miss_error(self, path: str, chunk_index: int) -> CacheMissError:
        """The error a readonly pass raises for a chunk ``lookup`` could not serve."""
        return self._reader.miss_error(path, chunk_index)

    # -- engine API: writing ------------------------------------------------
    def begin(
        self, path: str, chunk_index: int, n_tiles: int, stored_tile_shape: Sequence[int], dtype: npt.DTypeLike
    ) -> WriteHandle | None:
        """Start writing a chunk, or ``None``: keep it in memory (``CacheWriter.begin``)."""
        return self._writer.begin(path, chunk_index, n_tiles, stored_tile_shape, dtype)

    def write(self, handle: WriteHandle, tile_index: int, tile: np.ndarray) -> np.ndarray:
        """Copy one decoded tile into its position (GIL released); returns the writable view of it."""
        return self._writer.write(handle, tile_index, tile)

    def commit(self, handle: WriteHandle, tile_shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Publish a fully written chunk; its tiles as read-only zero-copy views (``CacheWriter.commit``)."""
        return self._writer.commit(handle, tile_shapes)

    def abort(self, handle: WriteHandle) -> None:
        """Drop an unfinished write: its temporary file is deleted, its claim released. Idempotent."""
        self._writer.abort(handle)

    def release(self, path: str, chunk_index: int) -> None:
        """Give up a claim ``find`` took for a chunk that will not be written (``CacheWriter.release``)."""
        self._writer.release(path, chunk_index)

    def evict(self, path: str, chunk_index: int) -> None:
        """Release a chunk's mapping; an ephemeral chunk's file is deleted, a persisted one stays.

        A no-op for a chunk the cache does not hold mapped.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            self._held.evict(key)

    # -- observability ------------------------------------------------------
    @property
    def mapped_bytes(self) -> int:
        """Tile-file bytes this cache holds mapped now (held chunks and writes in progress)."""
        with self._lock:
            return self._held.nbytes + self._writer.pending_bytes

    @property
    def revived(self) -> int:
        """Chunks mapped back from a persisted file by ``find``/``lookup``."""
        return self._reader.revived

    @property
    def revived_from_others(self) -> int:
        """The part of ``revived`` whose file another writer made (another process, or an earlier run)."""
        return self._reader.revived_from_others

    @property
    def written(self) -> int:
        """Chunks committed by this cache."""
        return self._writer.written

    @property
    def rejected(self) -> dict[str, int]:
        """Logged entries ``lookup`` turned away, by reason (``shape``, ``dtype``, ``missing``, ``file``, ``checksum``)."""
        return self._reader.rejected

    @property
    def dropped(self) -> dict[str, int]:
        """Log lines the load dropped, by reason (``stale``, ``superseded``, ``torn``)."""
        return self._index.dropped

    @property
    def refused(self) -> dict[str, int]:
        """Chunks ``begin`` did not write, by reason: ``full`` (disk), ``budget`` (``disk_bytes``), ``busy`` (claimed)."""
        with self._lock:
            return dict(self._space.refused)

    @property
    def persisting(self) -> bool:
        """False once a full disk stopped this cache writing."""
        return self._space.persisting

    @property
    def over_budget(self) -> bool:
        """True once a chunk was not written because it would have passed ``disk_bytes``."""
        return self._space.over_budget

    @property
    def disk_used_bytes(self) -> int:
        """Bytes of the tile files every writer logged (as this cache last read the logs)."""
        with self._lock:
            return self._index.logged_bytes()

    def entries(self) -> dict[Key, LogEntry]:
        """The persisted entries this cache knows, keyed ``(array_path, chunk_index)``."""
        with self._lock:
            return self._index.entries()

    @property
    def closed(self) -> bool:
        return self._held.closed

    # -- lifetime -----------------------------------------------------------
    def close(self) -> None:
        """Unmap everything, delete ephemeral files, release claims and locks. Idempotent.

        Views handed out stay valid: their bytes stay mapped until they die.
        """
        with self._lock:
            if self._held.closed:
                return
            self._writer.abort_all()
            self._claims.release_all()
            self._held.close()
            self._index.close()
            self._finalizer()
            if self.options.mode == "spill":  # spill space: no directory it made is left behind
                index = self._index
                leave_directory(self.cache_dir, index.shared_dir, index.log_path, made_dir=self._made_dir)

    def __enter__(self) -> DiskCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._held)} mapped, {len(self._index)} logged"
        return f"DiskCache({str(self.cache_dir)!r}, {self.options.mode}, {state})"


def open_dataset_cache(
    options: CacheOptions, *, fingerprints: Callable[[], Mapping[str, str]], store: Store | None = None
) -> DiskCache | None:
    """The disk cache ``options`` ask for, or ``None`` without a ``cache_dir``.

    ``fingerprints`` is called only when there is a cache to open (hashing
    transforms is not free). ``store``, the dataset's, places the cache in
    the subdirectory of the version it reads, if it names one
    (``CacheOptions.directory_for``).

    Raises
    ------
    ValueError
        ``persist`` over a writable icechunk session with uncommitted changes.
    """
    directory = options.directory_for(store)
    if directory is None:
        return None
    return DiskCache(
        directory,
        persist=options.persist,
        readonly=options.readonly,
        fingerprints=fingerprints(),
        reset_stale=options.reset_stale,
        disk_bytes=options.disk_bytes,
        on_corrupt=options.on_corrupt,
    )
