"""``DiskCache``: the mmap tier of the chunk pool, optionally persisted across runs.

One ``DiskCache`` serves one dataset over one ``cache_dir``. Every chunk it
holds is a tile-major ``.npy`` file (``tilefile.TileFile``) written under a
temporary name and renamed into place, so a file under its final name is always
complete, and a mapping another process holds keeps its own inode.

Without ``persist`` the directory is ephemeral spill: files are unlinked on
eviction and on close. With ``persist`` an append-only log (``log``) records
each completed chunk the moment it lands, and a later ``DiskCache`` over the
same directory revives those chunks as zero-copy read-only views.

What ``cache_dir`` holds is listed in ``files``.

Loading the log
---------------
A torn final append is dropped (its chunk is simply re-made) and the log is
compacted; any other damage raises ``CacheCorruptError``, whatever
``reset_stale`` says. A well-formed header of another format version makes
every entry stale. Entries whose fingerprint differs from
``fingerprints[path]`` are stale: ``StaleCacheError`` names the arrays unless
``reset_stale=True``, which deletes those arrays' files and entries. Entries
for arrays missing from ``fingerprints`` are kept untouched. The log is
rewritten only when a load dropped entries (stale, superseded, torn).

Views and ``close()``
---------------------
``lookup`` and ``commit`` return read-only numpy views of a ``PROT_READ``
mapping. ``evict`` and ``close`` release the cache's hold on a mapping; the
bytes stay mapped only while a view the caller kept is alive (``munmap``
runs when the last one dies), so a view never dangles. An ephemeral file
unlinked under a live view keeps its inode until the view dies. The cache
itself holds no mapping and no file descriptor after ``close()``.
"""

from __future__ import annotations

import operator
import os
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import CacheCorruptError, CacheMissError
from .bookkeeping import _Bookkeeping
from .files import (
    DROP_STALE,
    DROP_SUPERSEDED,
    DROP_TORN,
    REJECT_DTYPE,
    REJECT_FILE,
    REJECT_MISSING,
    REJECT_SHAPE,
    WriteHandle,
    _Mapped,
    _mismatch,
    _release_fds,
    tile_file_basename,
)
from .fingerprint import is_fingerprint
from .lock import LOCK_NAME, acquire_lock, network_filesystem
from .log import LOG_FORMAT, LOG_NAME, LOG_VERSION, Key, LogEntry, append_entry
from .tilefile import create_tile_file, open_tile_file, tile_view, write_tile

__all__ = [
    "DROP_STALE",
    "DROP_SUPERSEDED",
    "DROP_TORN",
    "LOCK_NAME",
    "LOG_FORMAT",
    "LOG_NAME",
    "LOG_VERSION",
    "REJECT_DTYPE",
    "REJECT_FILE",
    "REJECT_MISSING",
    "REJECT_SHAPE",
    "DiskCache",
    "LogEntry",
    "WriteHandle",
    "network_filesystem",
    "tile_file_basename",
]


class DiskCache(_Bookkeeping):
    """The mmap-backed chunk cache of one dataset over one ``cache_dir``.

    Parameters
    ----------
    cache_dir
        Directory of the tile files, the log and the lock file; created for a
        writer. It is the dataset's identity: one directory per source dataset.
    persist
        Keep files across runs and record each completed chunk in the log.
    readonly
        Take the lock shared and write nothing (needs ``persist=True``): a
        miss is the caller's to raise (``miss_error``).
    fingerprints
        ``{array_path: 16-hex pipeline fingerprint}`` of every array this run
        caches (``fingerprint.array_fingerprints``).
    reset_stale
        Delete the stale arrays' files and entries instead of raising.

    Raises
    ------
    CacheLockedError
        Another process holds the lock in a conflicting mode.
    CacheCorruptError
        The log is damaged (see the module docstring).
    StaleCacheError
        Entries of arrays in ``fingerprints`` were made by other transforms.
    ValueError
        A bad argument combination or fingerprint.

    Warns
    -----
    UserWarning
        When ``cache_dir`` is on a network or FUSE filesystem, where ``flock``
        may not arbitrate between hosts.

    Notes
    -----
    Thread-safe: decode threads may ``write`` to different handles while the
    scheduler calls the other methods.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        *,
        persist: bool,
        readonly: bool = False,
        fingerprints: Mapping[str, str],
        reset_stale: bool = False,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.persist = bool(persist)
        self.readonly = bool(readonly)
        if self.readonly and not self.persist:
            raise ValueError("readonly=True needs persist=True: only a persisted cache has anything to read")
        if self.readonly and reset_stale:
            raise ValueError("reset_stale=True deletes files, which a readonly cache never does; drop one of them")
        bad = {p: f for p, f in fingerprints.items() if not isinstance(p, str) or not is_fingerprint(f)}
        if bad:
            raise ValueError(f"fingerprints must map array paths to 16 lowercase hex digits; bad: {bad!r}")
        self.fingerprints = dict(fingerprints)
        self._reset_stale = bool(reset_stale)
        self.log_path = self.cache_dir / LOG_NAME
        self.lock_path = self.cache_dir / LOCK_NAME
        self._lock = threading.RLock()
        self._fds: list[int] = []
        self._finalizer = weakref.finalize(self, _release_fds, self._fds)
        self._log_fd: int | None = None
        self._entries: dict[Key, LogEntry] = {}
        self._mapped: dict[Key, _Mapped] = {}
        self._pending: dict[Key, WriteHandle] = {}
        self._spilled: set[Path] = set()
        self._miss_reasons: dict[Key, str] = {}
        self._revived = 0
        self._written = 0
        self._rejected: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()
        self._closed = False

        if self.readonly:
            if not self.cache_dir.is_dir():
                raise FileNotFoundError(
                    f"readonly cache_dir {str(self.cache_dir)!r} does not exist; warm it with a writing run first"
                )
        else:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        fs = network_filesystem(self.cache_dir)
        if fs is not None:
            warnings.warn(
                f"cache_dir {str(self.cache_dir)!r} is on a {fs} filesystem, where flock may be per client: "
                "two hosts writing this cache are not kept apart. Use a local disk for cache_dir.",
                UserWarning,
                stacklevel=2,
            )
        try:
            acquire_lock(self.cache_dir, self._fds, readonly=self.readonly)
            if not self.readonly:
                self._remove_temp_files()
            if self.persist:
                self._load_log()
            if not self.readonly:
                self._remove_orphans()
        except BaseException:
            self._finalizer()
            raise

    # -- engine API ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"DiskCache over {str(self.cache_dir)!r} is closed")

    def _fingerprint(self, path: str) -> str:
        try:
            return self.fingerprints[path]
        except KeyError:
            raise KeyError(
                f"array {path!r} has no fingerprint; DiskCache(fingerprints=...) covers {sorted(self.fingerprints)}"
            ) from None

    def lookup(
        self, path: str, chunk_index: int, tile_shapes: Sequence[Sequence[int]], dtype: npt.DTypeLike
    ) -> list[np.ndarray] | None:
        """The chunk's tiles as read-only zero-copy views, or ``None`` on a miss.

        A persisted entry is revived (mapped) when its tile shapes and dtype
        equal ``tile_shapes`` and ``dtype``; otherwise it is a miss, counted in
        ``rejected``, and the next ``commit`` of the chunk overwrites it. A
        chunk this cache still holds mapped is returned again.

        Parameters
        ----------
        path, chunk_index
            The array path and global sample-axis chunk index.
        tile_shapes
            Each tile's real shape, ``(chunk_len, *tile_extent)``.
        dtype
            The tiles' dtype (after chunk transforms).
        """
        key = (path, operator.index(chunk_index))
        shapes = tuple(tuple(int(x) for x in s) for s in tile_shapes)
        dt = np.dtype(dtype)
        with self._lock:
            self._check_open()
            held = self._mapped.get(key)
            if held is not None:
                mismatch = _mismatch(held.tile_shapes, held.tile_file.dtype, shapes, dt)
                if mismatch is None:
                    return self._views(held)
                self._reject(key, *mismatch)
                return None
            if not self.persist:
                return None
            self._fingerprint(path)
            entry = self._entries.get(key)
            if entry is None:
                self._miss_reasons[key] = "no entry in the log"
                return None
            mismatch = _mismatch(entry.tile_shapes, entry.dtype, shapes, dt)
            if mismatch is not None:
                self._reject(key, *mismatch)
                return None
            try:
                tile_file = open_tile_file(self.cache_dir / entry.file)
            except FileNotFoundError:
                self._reject(key, REJECT_MISSING, f"its file {entry.file} is missing")
                return None
            except CacheCorruptError as exc:
                # a damaged tile file is re-made from the store, not a reason to stop the run
                self._reject(key, REJECT_FILE, str(exc))
                return None
            fits = (
                tile_file.dtype == dt
                and tile_file.n_tiles == len(shapes)
                and all(
                    len(s) == len(tile_file.tile_shape) and all(a <= b for a, b in zip(s, tile_file.tile_shape))
                    for s in shapes
                )
            )
            if not fits:
                tile_file.close()
                self._reject(
                    key,
                    REJECT_FILE,
                    f"its file {entry.file} holds {tile_file.n_tiles} tiles of "
                    f"{tile_file.tile_shape} {tile_file.dtype}",
                )
                return None
            held = self._mapped[key] = _Mapped(tile_file, shapes)
            self._revived += 1
            self._miss_reasons.pop(key, None)
            return self._views(held)

    def _reject(self, key: Key, reason: str, detail: str) -> None:
        self._rejected[reason] += 1
        self._miss_reasons[key] = detail

    @staticmethod
    def _views(held: _Mapped) -> list[np.ndarray]:
        return [tile_view(held.tile_file, i, s) for i, s in enumerate(held.tile_shapes)]

    def miss_error(self, path: str, chunk_index: int) -> CacheMissError:
        """The error a readonly pass raises for a chunk ``lookup`` could not serve."""
        key = (path, operator.index(chunk_index))
        why = self._miss_reasons.get(key, "no entry in the log")
        return CacheMissError(
            f"readonly cache_dir {str(self.cache_dir)!r} cannot serve array {path!r} chunk {key[1]}: {why}. "
            "A readonly cache must already hold every chunk the pass reads; warm it with a writing run "
            "over the same split and transforms."
        )

    def begin(
        self, path: str, chunk_index: int, n_tiles: int, stored_tile_shape: Sequence[int], dtype: npt.DTypeLike
    ) -> WriteHandle:
        """Start writing a chunk: a tile file of ``n_tiles`` × ``stored_tile_shape`` under a temporary name.

        Raises
        ------
        PermissionError
            On a readonly cache.
        ValueError
            When the chunk is already being written.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            self._check_open()
            if self.readonly:
                raise PermissionError(
                    f"readonly cache over {str(self.cache_dir)!r} writes nothing; array {path!r} chunk {key[1]} "
                    "must already be cached (raise miss_error)"
                )
            if self.persist:
                self._fingerprint(path)
            if key in self._pending:
                raise ValueError(f"array {path!r} chunk {key[1]} is already being written; commit or abort it first")
            target = self.cache_dir / tile_file_basename(path, key[1], persist=self.persist)
            handle = WriteHandle(key, create_tile_file(target, n_tiles, stored_tile_shape, dtype, temp=True))
            self._pending[key] = handle
            return handle

    def write(self, handle: WriteHandle, tile_index: int, tile: np.ndarray) -> np.ndarray:
        """Copy one decoded tile into its position (GIL released); returns the writable view of it."""
        if handle.done:
            path, chunk = handle.key
            raise ValueError(f"the write of array {path!r} chunk {chunk} was already committed or aborted")
        view = write_tile(handle.tile_file, tile_index, tile)
        handle.written.add(int(tile_index))
        return view

    def commit(self, handle: WriteHandle, tile_shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Publish a fully written chunk and return its tiles as read-only zero-copy views.

        The file is renamed into place; with ``persist`` its log line is
        appended before this returns (unless the log already holds the same
        entry). A mapping of an older file of the chunk is released.

        Raises
        ------
        ValueError
            When a tile was never written or ``tile_shapes`` does not fit the file.
        """
        shapes = tuple(tuple(int(x) for x in s) for s in tile_shapes)
        sf = handle.tile_file
        path, chunk = handle.key
        if handle.done:
            raise ValueError(f"the write of array {path!r} chunk {chunk} was already committed or aborted")
        missing = sorted(set(range(sf.n_tiles)) - handle.written)
        if missing:
            raise ValueError(f"array {path!r} chunk {chunk}: tiles {missing} of {sf.n_tiles} were never written")
        if len(shapes) != sf.n_tiles or any(
            len(s) != len(sf.tile_shape) or any(a > b for a, b in zip(s, sf.tile_shape)) for s in shapes
        ):
            raise ValueError(
                f"array {path!r} chunk {chunk}: tile_shapes {shapes} must be {sf.n_tiles} shapes that fit the "
                f"stored tile shape {sf.tile_shape}"
            )
        with self._lock:
            self._check_open()
            final = sf.publish()
            sf.close()  # the writable mapping goes once write()'s views die
            handle.done = True
            del self._pending[handle.key]
            readable = open_tile_file(final)
            old = self._mapped.pop(handle.key, None)
            if old is not None:
                old.tile_file.close()
            held = self._mapped[handle.key] = _Mapped(readable, shapes)
            self._written += 1
            self._miss_reasons.pop(handle.key, None)
            if self.persist:
                entry = LogEntry(path, chunk, final.name, shapes, sf.dtype, self.fingerprints[path])
                if self._entries.get(handle.key) != entry:
                    assert self._log_fd is not None
                    append_entry(self._log_fd, entry)
                    self._entries[handle.key] = entry
            else:
                self._spilled.add(final)
            return self._views(held)

    def abort(self, handle: WriteHandle) -> None:
        """Drop an unfinished write: its temporary file is deleted. Idempotent."""
        with self._lock:
            if not handle.done:
                handle.done = True
                self._pending.pop(handle.key, None)
                handle.tile_file.close()

    def evict(self, path: str, chunk_index: int) -> None:
        """Release a chunk's mapping; an ephemeral chunk's file is deleted, a persisted one stays.

        A no-op for a chunk the cache does not hold mapped.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            held = self._mapped.pop(key, None)
            if held is None:
                return
            held.tile_file.close()
            if not self.persist:
                held.tile_file.path.unlink(missing_ok=True)
                self._spilled.discard(held.tile_file.path)

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Unmap everything, delete ephemeral files, release the lock. Idempotent.

        Views handed out stay valid: their bytes stay mapped until they die.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for handle in list(self._pending.values()):
                self.abort(handle)
            for held in self._mapped.values():
                held.tile_file.close()
            self._mapped.clear()
            for p in self._spilled:
                p.unlink(missing_ok=True)
            self._spilled.clear()
            self._log_fd = None
            self._finalizer()

    def __enter__(self) -> DiskCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else ("persist" if self.persist else "spill")
        state = "closed" if self._closed else f"{len(self._mapped)} mapped, {len(self._entries)} logged"
        return f"DiskCache({str(self.cache_dir)!r}, {mode}, {state})"
