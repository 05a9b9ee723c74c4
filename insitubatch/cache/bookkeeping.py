"""``DiskCache``'s bookkeeping: its log, the files it owns on disk, and the counters it reports.

A mixin so the cache class reads as its engine API (lookup, begin, write,
commit, evict) and its lifetime; the state lives on ``DiskCache`` and is
declared here only for the type checker.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from ..errors import StaleCacheError
from .files import (
    _OWNED_TEMP,
    _OWNED_TILE_FILE,
    _SPILL_PREFIX,
    DROP_STALE,
    DROP_SUPERSEDED,
    DROP_TORN,
    WriteHandle,
    _Mapped,
)
from .log import LOG_VERSION, Key, LogEntry, open_log, read_log, write_log


class _Bookkeeping:
    """The log (load, compact, append fd), housekeeping of owned files, and the observability properties."""

    cache_dir: Path
    log_path: Path
    persist: bool
    readonly: bool
    fingerprints: dict[str, str]
    _reset_stale: bool
    _lock: threading.RLock
    _fds: list[int]
    _log_fd: int | None
    _entries: dict[Key, LogEntry]
    _mapped: dict[Key, _Mapped]
    _pending: dict[Key, WriteHandle]
    _revived: int
    _written: int
    _rejected: Counter[str]
    _dropped: Counter[str]
    _closed: bool

    # -- log ----------------------------------------------------------------

    def _load_log(self) -> None:
        contents = read_log(self.log_path)
        if contents is None:
            if not self.readonly:
                self._rewrite_log()
            return
        if contents.version != LOG_VERSION:
            self._reset_other_version(contents.version)
            return
        entries = contents.entries
        if contents.superseded:
            self._dropped[DROP_SUPERSEDED] += contents.superseded
        if contents.torn:
            self._dropped[DROP_TORN] += 1
        stale: dict[str, tuple[str, int]] = {}
        for e in entries.values():
            want = self.fingerprints.get(e.path)
            if want is not None and e.fingerprint != want:
                fp, n = stale.get(e.path, (e.fingerprint, 0))
                stale[e.path] = (fp, n + 1)
        if stale and not self._reset_stale:
            detail = "; ".join(
                f"{p!r}: {n} chunks made by transforms {fp}, now {self.fingerprints[p]}"
                for p, (fp, n) in sorted(stale.items())
            )
            raise StaleCacheError(
                f"cache_dir {str(self.cache_dir)!r} holds stale entries for arrays {sorted(stale)} — their chunk "
                f"transforms changed ({detail}). {self._stale_advice('delete and rebuild just those arrays')}"
            )
        for key in [k for k, e in entries.items() if e.path in stale]:
            self._remove_file(entries.pop(key).file)
            self._dropped[DROP_STALE] += 1
        self._entries = entries
        if self._dropped and not self.readonly:
            self._rewrite_log()
        elif not self.readonly:
            self._open_log()

    def _stale_advice(self, reset_does: str) -> str:
        """What to do about stale entries: a writer can reset them; a readonly reader cannot write at all."""
        if self.readonly:
            return (
                "A readonly_cache reader never writes, so it cannot rebuild them: rewarm the cache with one "
                f"writing run (persist=True, reset_stale_cache=True: {reset_does}) using these chunk transforms, "
                "read it with the transforms that made it, or point the readers at another cache_dir."
            )
        return f"Pass reset_stale_cache=True to {reset_does}, or use another cache_dir."

    def _reset_other_version(self, version: int) -> None:
        """A log of another format version: nothing in it can be read, so every entry is stale."""
        if not self._reset_stale:
            raise StaleCacheError(
                f"{self.log_path} is cache log format version {version}; this insitubatch reads version "
                f"{LOG_VERSION}. {self._stale_advice('delete the whole cache and rebuild it')}"
            )
        for name in os.listdir(self.cache_dir):
            if _OWNED_TILE_FILE.match(name):
                self._remove_file(name)
        self._dropped[DROP_STALE] += 1
        self._entries = {}
        self._rewrite_log()

    def _rewrite_log(self) -> None:
        """Compact: the header and every live entry replace the log, then reopen it for appends."""
        if self._log_fd is not None:
            self._close_log_fd()
        write_log(self.log_path, list(self._entries.values()))
        self._open_log()

    def _open_log(self) -> None:
        self._log_fd = open_log(self.log_path)
        self._fds.append(self._log_fd)

    def _close_log_fd(self) -> None:
        fd, self._log_fd = self._log_fd, None
        if fd is not None:
            self._fds.remove(fd)
            os.close(fd)

    # -- housekeeping (writers only: the exclusive lock means no one else is mid-write) --

    def _remove_file(self, name: str) -> None:
        (self.cache_dir / name).unlink(missing_ok=True)

    def _remove_temp_files(self) -> None:
        for name in os.listdir(self.cache_dir):
            if _OWNED_TEMP.match(name):
                self._remove_file(name)

    def _remove_orphans(self) -> None:
        """Spill files of crashed runs, and persisted files no log entry names (a torn or lost append)."""
        logged = {e.file for e in self._entries.values()}
        for name in os.listdir(self.cache_dir):
            m = _OWNED_TILE_FILE.match(name)
            if m is None:
                continue
            if m.group(1) == _SPILL_PREFIX or (self.persist and name not in logged):
                self._remove_file(name)

    # -- observability ------------------------------------------------------

    @property
    def mapped_bytes(self) -> int:
        """Tile-file bytes this cache holds mapped now (held chunks and writes in progress)."""
        with self._lock:
            held = sum(m.nbytes for m in self._mapped.values())
            return held + sum(h.tile_file.n_tiles * h.tile_file.tile_bytes for h in self._pending.values())

    @property
    def revived(self) -> int:
        """Chunks mapped back from a persisted file by ``lookup``."""
        return self._revived

    @property
    def written(self) -> int:
        """Chunks committed by this cache."""
        return self._written

    @property
    def rejected(self) -> dict[str, int]:
        """Logged entries ``lookup`` turned away, by reason (``shape``, ``dtype``, ``missing``, ``file``)."""
        with self._lock:
            return dict(self._rejected)

    @property
    def dropped(self) -> dict[str, int]:
        """Log lines the load dropped, by reason (``stale``, ``superseded``, ``torn``)."""
        return dict(self._dropped)

    def entries(self) -> dict[Key, LogEntry]:
        """The persisted entries this cache knows, keyed ``(array_path, chunk_index)``."""
        with self._lock:
            return dict(self._entries)

    @property
    def closed(self) -> bool:
        return self._closed
