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
writers and readonly readers keep apart, in ``lock``. The class is written
in three parts: ``reading`` (``find``, ``lookup``), ``writing``
(``begin`` … ``commit``), ``bookkeeping`` (opening a directory, counters).

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

import itertools
import operator
import os
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

from .claims import Claims
from .files import (
    DROP_STALE,
    DROP_SUPERSEDED,
    DROP_TORN,
    REJECT_CHECKSUM,
    REJECT_DTYPE,
    REJECT_FILE,
    REJECT_MISSING,
    REJECT_SHAPE,
    SHARED_DIR,
    WriteHandle,
    _Mapped,
    new_writer_token,
    persisted_basename,
    spill_basename,
)
from .fingerprint import is_fingerprint
from .ledger import Ledger
from .lock import LOCK_NAME, leave_directory, network_filesystem, release_fds, require_flock
from .log import LOG_FORMAT, LOG_NAME, LOG_VERSION, Key, LogEntry
from .reading import Found, _Reading
from .writing import _Writing

__all__ = [
    "DROP_STALE",
    "DROP_SUPERSEDED",
    "DROP_TORN",
    "LOCK_NAME",
    "LOG_FORMAT",
    "LOG_NAME",
    "LOG_VERSION",
    "ON_CORRUPT",
    "REJECT_CHECKSUM",
    "REJECT_DTYPE",
    "REJECT_FILE",
    "REJECT_MISSING",
    "REJECT_SHAPE",
    "SHARED_DIR",
    "DiskCache",
    "Found",
    "LogEntry",
    "OnCorrupt",
    "WriteHandle",
    "network_filesystem",
    "persisted_basename",
    "spill_basename",
]

OnCorrupt = Literal["refetch", "raise"]
ON_CORRUPT: tuple[OnCorrupt, ...] = get_args(OnCorrupt)


class DiskCache(_Reading, _Writing):
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
    ValueError
        A bad argument combination or fingerprint.

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
        if disk_bytes is not None and (type(disk_bytes) is not int or disk_bytes <= 0):
            raise ValueError(f"disk_bytes={disk_bytes!r} must be a positive int or None (no cap)")
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt={on_corrupt!r} must be one of {ON_CORRUPT}")
        require_flock(self.cache_dir)
        self.fingerprints = dict(fingerprints)
        self.disk_bytes = disk_bytes
        self.on_corrupt: OnCorrupt = on_corrupt
        self.verify = True  # check each file's CRC-32C when first revived (the bench turns it off to measure it)
        self.token = new_writer_token()
        self._reset_stale = bool(reset_stale)
        self.log_path = self.cache_dir / LOG_NAME
        self.lock_path = self.cache_dir / LOCK_NAME
        self._lock = threading.RLock()
        self._fds: list[int] = []
        self._finalizer = weakref.finalize(self, release_fds, self._fds)
        self._ledger = Ledger(self.cache_dir)
        self._claims = Claims(self._ledger.shared_dir, self._fds)
        self._entries: dict[Key, LogEntry] = {}
        self._own: set[tuple[Key, int]] = set()  # (key, t) of the lines this writer appended
        self._file_bytes: dict[str, int] = {}  # every logged file's size, whoever wrote it (the disk budget)
        self._mapped: dict[Key, _Mapped] = {}
        self._pending: dict[Key, WriteHandle] = {}
        self._spilled: set[Path] = set()
        self._miss_reasons: dict[Key, str] = {}
        # entries turned away, for any request (a damaged file: None) or for one (shapes, dtype): not tried again
        self._bad: dict[Key, tuple[LogEntry, tuple | None]] = {}
        self._verified_files: dict[str, tuple[tuple[int, int, int], int]] = {}  # file name -> (identity, CRC) checked
        self._warned_files: set[str] = set()
        self._temp_ids = itertools.count()
        self._last_refresh = 0.0
        self._revived = 0
        self._revived_others = 0
        self._written = 0
        self._rejected: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._persisting = not self.readonly
        self._full_warned = False
        self._over_budget = False
        self._closed = False
        self._made_dir = False

        if self.readonly:
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
            if self.readonly:
                self._open_as_reader()
            else:
                self._open_as_writer()
        except BaseException:
            self._finalizer()
            raise

    # -- engine API ---------------------------------------------------------

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
        """Unmap everything, delete ephemeral files, release claims and locks. Idempotent.

        Views handed out stay valid: their bytes stay mapped until they die.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for handle in list(self._pending.values()):
                self.abort(handle)
            self._claims.release_all()
            for held in self._mapped.values():
                held.tile_file.close()
            self._mapped.clear()
            for p in self._spilled:
                p.unlink(missing_ok=True)
            self._spilled.clear()
            self._ledger.close(self._fds)
            self._finalizer()
            if not self.persist and not self.readonly:  # spill space: no directory it made is left behind
                leave_directory(self.cache_dir, self._ledger.shared_dir, self.log_path, made_dir=self._made_dir)

    def __enter__(self) -> DiskCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else ("persist" if self.persist else "spill")
        state = "closed" if self._closed else f"{len(self._mapped)} mapped, {len(self._entries)} logged"
        return f"DiskCache({str(self.cache_dir)!r}, {mode}, {state})"
