"""``DiskCache``'s writing side: ``begin``/``write``/``commit``/``abort`` a chunk, claims and disk budget included.

A mixin of ``DiskCache`` (see ``disk`` for the whole); its state is declared
on ``_Bookkeeping``.

A persisted chunk is written by the one writer holding its claim (taken by
``find`` on a miss, or here), into a temporary file renamed into place, and
only then logged, with the file's CRC-32C; the claim goes last. ``begin``
returns ``None`` — keep the chunk in memory — when the disk is full, when the
chunk would pass ``disk_bytes``, or when another writer holds its claim.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from .bookkeeping import _FULL_ERRNOS, _Bookkeeping, now_ns
from .files import WriteHandle, _Mapped, claim_name, persisted_basename, spill_basename
from .log import Key, LogEntry
from .tilefile import TileFile, create_tile_file, open_tile_file, tile_file_nbytes, write_tile

__all__: list[str] = []


class _Writing(_Bookkeeping):
    """``begin``, ``write``, ``commit``, ``abort`` and ``release`` of ``DiskCache``."""

    disk_bytes: int | None
    _spilled: set
    _miss_reasons: dict[Key, str]
    _bad: dict
    _verified_files: dict
    _temp_ids: Iterator[int]
    _over_budget: bool

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
            self._check_open()
            if self.readonly:
                raise PermissionError(
                    f"readonly cache over {str(self.cache_dir)!r} writes nothing; array {path!r} chunk {key[1]} "
                    "must already be cached (raise miss_error)"
                )
            if key in self._pending:
                raise ValueError(f"array {path!r} chunk {key[1]} is already being written; commit or abort it first")
            if not self._persisting:
                self._refused["full"] += 1
                return None
            if self.persist:
                name = persisted_basename(path, key[1], self._fingerprint(path))
            else:
                name = spill_basename(path, key[1], self.token)
            nbytes = tile_file_nbytes(n_tiles, stored_tile_shape, dtype)
            if self.persist and not self._fits_budget(name, nbytes):
                self._refused["budget"] += 1
                self._over_budget = True
                self._claims.release(claim_name(name))
                return None
            try:
                if self.persist and not self._claims.take(claim_name(name)):
                    self._refused["busy"] += 1
                    return None
                tag = f"{self.token}-{next(self._temp_ids)}"
                tile_file = create_tile_file(self.cache_dir / name, n_tiles, stored_tile_shape, dtype, temp=tag)
            except OSError as exc:
                if exc.errno not in _FULL_ERRNOS:
                    raise
                if self.persist:
                    self._claims.release(claim_name(name))
                self._disk_full(exc, nbytes)
                return None
            handle = self._pending[key] = WriteHandle(key, tile_file, nbytes)
            return handle

    def _fits_budget(self, name: str, nbytes: int) -> bool:
        """Whether a file of ``nbytes`` at ``name`` keeps the directory within ``disk_bytes`` (lock held)."""
        if self.disk_bytes is None:
            return True
        self._refresh()  # what the others logged up to now (their writes in flight stay unseen)
        logged = sum(self._file_bytes.values()) - self._file_bytes.get(name, 0)
        writing = sum(h.nbytes for h in self._pending.values())
        return logged + writing + nbytes <= self.disk_bytes

    @property
    def over_budget(self) -> bool:
        """True once a chunk was not written because it would have passed ``disk_bytes``."""
        return self._over_budget

    @property
    def disk_used_bytes(self) -> int:
        """Bytes of the tile files every writer logged (as this cache last read the logs)."""
        with self._lock:
            return sum(self._file_bytes.values())

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
        crc = sf.checksum() if self.persist else 0  # ours alone until published: no lock needed
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
                self._log(handle.key, final.name, shapes, sf, crc, readable)
            else:
                self._spilled.add(final)
            return self._views(held)

    def _log(self, key: Key, name: str, shapes, sf: TileFile, crc: int, readable: TileFile) -> None:
        """Append a committed chunk's line and let go of its claim (lock held)."""
        path, chunk = key
        entry = LogEntry(path, chunk, name, shapes, sf.dtype, self.fingerprints[path], sf.nbytes, crc, now_ns())
        self._verified_files[name] = (readable.identity, crc)
        self._bad.pop(key, None)
        current = self._entries.get(key)
        try:
            if current is None or dataclasses.replace(entry, t=current.t) != current:  # else the log has it
                self._ledger.append(entry)
                self._entries[key] = entry
                self._own.add((key, entry.t))
                self._file_bytes[name] = entry.nbytes
        except OSError as exc:
            if exc.errno not in _FULL_ERRNOS:
                raise
            self._disk_full(exc, len(entry.to_line()))
        finally:
            self._claims.release(claim_name(name))

    def abort(self, handle: WriteHandle) -> None:
        """Drop an unfinished write: its temporary file is deleted, its claim released. Idempotent."""
        with self._lock:
            if not handle.done:
                handle.done = True
                self._pending.pop(handle.key, None)
                handle.tile_file.close()
                if self.persist:
                    self._claims.release(claim_name(handle.tile_file.path.name))

    def release(self, path: str, chunk_index: int) -> None:
        """Give up a claim ``find`` took for a chunk that will not be written (it failed, or was abandoned).

        A no-op when the chunk is not claimed, or is being written.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            if self.persist and key not in self._pending and path in self.fingerprints:
                self._claims.release(claim_name(persisted_basename(path, key[1], self.fingerprints[path])))
