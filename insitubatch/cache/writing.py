"""``CacheWriter``: a ``DiskCache``'s writing side: ``begin``/``write``/``commit``/``abort`` a chunk, claims and disk budget included.

The writer holds the cache's index (to log), its held chunks (a committed
chunk is held), its claims, its disk space and its reader (told of each
commit); it owns the writes in progress.

A persisted chunk is written by the one writer holding its claim (taken by
``find`` on a miss, or here), into a temporary file renamed into place, and
only then logged, with the file's CRC-32C; the claim goes last. ``begin``
returns ``None`` — keep the chunk in memory — when the disk is full, when the
chunk would pass ``disk_bytes``, or when another writer holds its claim.
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .claims import Claims
from .files import WriteHandle, claim_name, persisted_basename, spill_basename
from .held import HeldChunks
from .index import CacheIndex
from .log import Key, LogEntry
from .options import CacheOptions
from .reading import CacheReader
from .space import FULL_ERRNOS, DiskSpace
from .tilefile import TileFile, create_tile_file, open_tile_file, tile_file_nbytes, write_tile

__all__ = ["CacheWriter", "now_ns"]


def now_ns() -> int:
    """A log line's ``t``: wall-clock ns, comparable between the writers of one host."""
    return time.time_ns()


class CacheWriter:
    """``begin``, ``write``, ``commit``, ``abort`` and ``release`` of a ``DiskCache``.

    Parameters
    ----------
    options
        The cache's options (``persist``, ``readonly``, ``disk_bytes``).
    token
        This writer's identity, in its temporary and spill file names.
    index, held, claims, space, reader
        The cache's logged entries, mapped chunks, write claims, writing state and reader.
    lock
        The cache's lock, held around every touch of the parts above.
    """

    def __init__(
        self,
        options: CacheOptions,
        *,
        token: str,
        index: CacheIndex,
        held: HeldChunks,
        claims: Claims,
        space: DiskSpace,
        reader: CacheReader,
        lock: threading.RLock,
    ) -> None:
        self.options = options
        self.cache_dir = index.cache_dir
        self.token = token
        self.written = 0  # chunks committed
        self._index = index
        self._held = held
        self._claims = claims
        self._space = space
        self._reader = reader
        self._lock = lock
        self._pending: dict[Key, WriteHandle] = {}
        self._temp_ids = itertools.count()

    @property
    def pending_bytes(self) -> int:
        """Tile-file bytes of the writes in progress (lock held)."""
        return sum(h.tile_file.n_tiles * h.tile_file.tile_bytes for h in self._pending.values())

    def begin(
        self, path: str, chunk_index: int, n_tiles: int, stored_tile_shape: Sequence[int], dtype: npt.DTypeLike
    ) -> WriteHandle | None:
        """Start writing a chunk: a tile file of ``n_tiles`` × ``stored_tile_shape`` under a temporary name.

        ``None`` when the chunk is not to be written — keep it in memory: the
        disk is full (``refused["full"]``), it would pass ``disk_bytes``
        (``refused["budget"]``, ``over_budget``), or another writer holds its
        claim (``refused["busy"]``). A persisted chunk is claimed here unless
        ``find`` claimed it already.

        Raises
        ------
        PermissionError
            On a readonly cache.
        ValueError
            When the chunk is already being written.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            self._held.check_open()
            if self.options.readonly:
                raise PermissionError(
                    f"readonly cache over {str(self.cache_dir)!r} writes nothing; array {path!r} chunk {key[1]} "
                    "must already be cached (raise miss_error)"
                )
            if key in self._pending:
                raise ValueError(f"array {path!r} chunk {key[1]} is already being written; commit or abort it first")
            persist = self.options.persist
            if not self._space.persisting:
                self._space.refuse("full")
                return None
            if persist:
                name = persisted_basename(path, key[1], self._index.fingerprint(path))
            else:
                name = spill_basename(path, key[1], self.token)
            nbytes = tile_file_nbytes(n_tiles, stored_tile_shape, dtype)
            if persist and not self._fits_budget(name, nbytes):
                self._space.refuse("budget")
                self._claims.release(claim_name(name))
                return None
            try:
                if persist and not self._claims.take(claim_name(name)):
                    self._space.refuse("busy")
                    return None
                tag = f"{self.token}-{next(self._temp_ids)}"
                tile_file = create_tile_file(self.cache_dir / name, n_tiles, stored_tile_shape, dtype, temp=tag)
            except OSError as exc:
                if exc.errno not in FULL_ERRNOS:
                    raise
                if persist:
                    self._claims.release(claim_name(name))
                self._space.stop(exc, nbytes)
                return None
            handle = self._pending[key] = WriteHandle(key, tile_file, nbytes)
            return handle

    def _fits_budget(self, name: str, nbytes: int) -> bool:
        """Whether a file of ``nbytes`` at ``name`` keeps the directory within ``disk_bytes`` (lock held)."""
        disk_bytes = self.options.disk_bytes
        if disk_bytes is None:
            return True
        self._index.refresh()  # what the others logged up to now (their writes in flight stay unseen)
        logged = self._index.logged_bytes(besides=name)
        writing = sum(h.nbytes for h in self._pending.values())
        return logged + writing + nbytes <= disk_bytes

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

        The file is renamed into place; with ``persist`` its log line (with
        the file's CRC-32C) is appended before this returns, unless the log
        already holds the same entry, and its claim is released. A mapping
        of an older file of the chunk is released. A full disk while logging
        leaves the file unlogged (a later writer alone deletes it) and stops
        this cache writing; the views are returned all the same.

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
        persist = self.options.persist
        crc = sf.checksum() if persist else 0  # ours alone until published: no lock needed
        with self._lock:
            self._held.check_open()
            final = sf.publish()
            sf.close()  # the writable mapping goes once write()'s views die
            handle.done = True
            del self._pending[handle.key]
            readable = open_tile_file(final)
            held = self._held.hold(handle.key, readable, shapes, spill=not persist)
            self.written += 1
            self._reader.committed(handle.key, verified=(final.name, readable.identity, crc) if persist else None)
            if persist:
                self._log(handle.key, final.name, shapes, sf, crc)
            return held.views()

    def _log(self, key: Key, name: str, shapes: tuple[tuple[int, ...], ...], sf: TileFile, crc: int) -> None:
        """Append a committed chunk's line and let go of its claim (lock held)."""
        path, chunk = key
        entry = LogEntry(path, chunk, name, shapes, sf.dtype, self._index.fingerprint(path), sf.nbytes, crc, now_ns())
        try:
            self._index.log(entry)
        except OSError as exc:
            if exc.errno not in FULL_ERRNOS:
                raise
            self._space.stop(exc, len(entry.to_line()))
        finally:
            self._claims.release(claim_name(name))

    def abort(self, handle: WriteHandle) -> None:
        """Drop an unfinished write: its temporary file is deleted, its claim released. Idempotent."""
        with self._lock:
            if not handle.done:
                handle.done = True
                self._pending.pop(handle.key, None)
                handle.tile_file.close()
                if self.options.persist:
                    self._claims.release(claim_name(handle.tile_file.path.name))

    def release(self, path: str, chunk_index: int) -> None:
        """Give up a claim ``find`` took for a chunk that will not be written (it failed, or was abandoned).

        A no-op when the chunk is not claimed, or is being written.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            if self.options.persist and key not in self._pending and path in self._index.fingerprints:
                self._claims.release(claim_name(persisted_basename(path, key[1], self._index.fingerprint(path))))

    def abort_all(self) -> None:
        """Abort every write in progress (closing)."""
        with self._lock:
            for handle in list(self._pending.values()):
                self.abort(handle)
