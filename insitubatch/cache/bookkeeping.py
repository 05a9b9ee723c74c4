"""``DiskCache``'s bookkeeping: opening a directory (admission, tidying, loading the logs), and its counters.

A mixin so the cache class reads as its engine API (find, begin, write,
commit, evict) and its lifetime; the state lives on ``DiskCache`` and is
declared here only for the type checker.

Opening as a writer holds the gate exclusively throughout (``lock``): the
writer finds which other writers are alive (their segments are locked),
deletes what dead writers left half-done (temporary files, spill files),
loads every log, and registers its own segment. Only a writer that finds
itself *alone* changes what others could be reading: it compacts the logs
into the base log, deletes files no entry names, and applies
``reset_stale``. With other writers alive those wait for a later opener that
is alone — except ``reset_stale``, which must delete files now and so
raises ``CacheLockedError`` naming the writers in the way.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import CacheLockedError, StaleCacheError
from .claims import Claims
from .files import (
    _CLAIM,
    _OWNED_TEMP,
    _OWNED_TILE_FILE,
    _SEGMENT_TEMP,
    DROP_STALE,
    DROP_SUPERSEDED,
    DROP_TORN,
    WriteHandle,
    _Mapped,
)
from .ledger import Ledger, Loaded
from .lock import (
    HolderRecord,
    holder_record,
    open_gate,
    probe,
    sign_gate,
    unlock,
    writers_message,
)
from .log import LOG_VERSION, Key, LogEntry
from .tilefile import tile_view

logger = logging.getLogger("insitubatch")

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class _Bookkeeping:
    """Admission, housekeeping and log loading of a ``DiskCache``, and its observability properties."""

    cache_dir: Path
    persist: bool
    readonly: bool
    fingerprints: dict[str, str]
    token: str
    _reset_stale: bool
    _lock: threading.RLock
    _fds: list[int]
    _ledger: Ledger
    _claims: Claims
    _entries: dict[Key, LogEntry]
    _own: set[tuple[Key, int]]
    _file_bytes: dict[str, int]
    _mapped: dict[Key, _Mapped]
    _pending: dict[Key, WriteHandle]
    _revived: int
    _revived_others: int
    _written: int
    _rejected: Counter[str]
    _dropped: Counter[str]
    _refused: Counter[str]
    _persisting: bool
    _full_warned: bool
    _closed: bool

    # -- opening ------------------------------------------------------------------
    def _open_as_writer(self) -> None:
        """Admission under the exclusive gate: tidy, load, register (see the module docstring)."""
        fd = open_gate(self.cache_dir, shared=False, writable=True)
        self._fds.append(fd)
        try:
            record = holder_record(self.token)
            sign_gate(fd, record)
            live = self._live_writers()
            self._tidy(live)
            if self.persist:
                self._load(live)
            try:
                self._ledger.register(self.token, record, self._fds)
            except OSError as exc:
                if exc.errno not in _FULL_ERRNOS:
                    raise
                self._disk_full(exc, len(str(record)))
        finally:
            self._fds.remove(fd)
            os.close(fd)  # lets the next opener in

    def _open_as_reader(self) -> None:
        """Hold the gate shared for life, provided no writer is alive; load the logs."""
        # the lock file is the one file a readonly cache may create: without it, no writer could be excluded
        fd = open_gate(self.cache_dir, shared=True, writable=False)
        self._fds.append(fd)
        live = self._live_writers()
        if live:
            unlock(fd)
            raise CacheLockedError(
                errno.EAGAIN,
                writers_message(
                    self.cache_dir, live, wanted="read it (readonly_cache=True needs a cache nobody writes)"
                ),
            )
        self._load({})

    def _live_writers(self) -> dict[str, HolderRecord | None]:
        """``{segment name: its writer's record}`` of the writers alive now (their segments are locked)."""
        ledger = self._ledger
        return {
            name: ledger.holder(name)
            for name in ledger.segment_names()
            if probe(ledger.shared_dir / name) and name != ledger.segment_name
        }

    def _tidy(self, live: Mapping[str, HolderRecord | None]) -> None:
        """Delete what dead writers left: temporary and spill files, and (when alone) claims and segment temps."""
        tokens = {name.removesuffix(".jsonl") for name in live}
        alone = not live
        for name in os.listdir(self.cache_dir):
            m = _OWNED_TEMP.match(name)
            if m is not None and (alone or m.group("tag") not in tokens):
                self._remove_file(name)
                continue
            m = _OWNED_TILE_FILE.match(name)
            if m is not None and name.startswith("spill-") and (alone or m.group("spiller") not in tokens):
                self._remove_file(name)
        shared = self._ledger.shared_dir
        if not shared.is_dir():
            return
        for name in os.listdir(shared):
            # a segment temp is an admission that died (ours holds the gate); a claim is a dead writer's when alone
            if _SEGMENT_TEMP.match(name) or (alone and _CLAIM.match(name)):
                (shared / name).unlink(missing_ok=True)

    def _load(self, live: Mapping[str, HolderRecord | None]) -> None:
        """Read every log; drop stale entries (or raise); compact and delete orphans when alone."""
        alone = not live and not self.readonly
        loaded = self._ledger.load(live)
        if loaded.version != LOG_VERSION:
            self._reset_other_version(loaded, live)
            return
        entries = loaded.entries
        self._dropped[DROP_SUPERSEDED] += loaded.superseded
        self._dropped[DROP_TORN] += loaded.torn
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
        if stale and live:
            raise CacheLockedError(
                errno.EAGAIN,
                writers_message(
                    self.cache_dir, live, wanted=f"reset the stale arrays {sorted(stale)} (reset_stale_cache=True)"
                ),
            )
        for key in [k for k, e in entries.items() if e.path in stale]:
            self._remove_file(entries.pop(key).file)
            self._dropped[DROP_STALE] += 1
        self._dropped = +self._dropped  # keep only the reasons that happened
        self._entries = entries
        self._file_bytes = {e.file: e.nbytes for e in entries.values()}
        if alone and (self._dropped or loaded.segments or not loaded.base_exists):
            self._compact(loaded)

    def _stale_advice(self, reset_does: str) -> str:
        """What to do about stale entries: a writer can reset them; a readonly reader cannot write at all."""
        if self.readonly:
            return (
                "A readonly_cache reader never writes, so it cannot rebuild them: rewarm the cache with one "
                f"writing run (persist=True, reset_stale_cache=True: {reset_does}) using these chunk transforms, "
                "read it with the transforms that made it, or point the readers at another cache_dir."
            )
        return f"Pass reset_stale_cache=True to {reset_does}, or use another cache_dir."

    def _compact(self, loaded: Loaded) -> None:
        """Alone: fold every log into the base log and delete tile files no entry names."""
        try:
            self._ledger.compact(self._entries.values(), loaded.segments)
        except OSError as exc:  # a full disk: the logs stay as they are, still correct
            if exc.errno not in _FULL_ERRNOS:
                raise
            self._disk_full(exc, 0)
            return
        named = {e.file for e in self._entries.values()}
        for name in os.listdir(self.cache_dir):
            if _OWNED_TILE_FILE.match(name) and name not in named:
                self._remove_file(name)

    def _reset_other_version(self, loaded: Loaded, live: Mapping[str, HolderRecord | None]) -> None:
        """A log of another format version: nothing in it can be read, so every entry is stale."""
        where = self._ledger.base_path if loaded.base_exists else self._ledger.shared_dir
        if not self._reset_stale:
            raise StaleCacheError(
                f"{where} is cache log format version {loaded.version}; this insitubatch reads version "
                f"{LOG_VERSION}. {self._stale_advice('delete the whole cache and rebuild it')}"
            )
        if live:
            raise CacheLockedError(
                errno.EAGAIN, writers_message(self.cache_dir, live, wanted="reset it (reset_stale_cache=True)")
            )
        for name in os.listdir(self.cache_dir):
            if _OWNED_TILE_FILE.match(name):
                self._remove_file(name)
        self._dropped[DROP_STALE] += 1
        self._entries = {}
        self._file_bytes = {}
        self._ledger.compact([], self._ledger.segment_names())

    # -- shared by reading and writing ----------------------------------------------
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

    def _refresh(self) -> None:
        """Take in the lines other writers logged since the last look (lock held)."""
        if self.readonly or not self.persist:
            return
        self._last_refresh = time.monotonic()
        for e in self._ledger.refresh():
            self._file_bytes[e.file] = e.nbytes
            want = self.fingerprints.get(e.path)
            if want is not None and e.fingerprint != want:
                continue  # a writer running other transforms: its files have other names
            old = self._entries.get(e.key)
            if old is None or e.t >= old.t:
                self._entries[e.key] = e

    @staticmethod
    def _views(held: _Mapped) -> list[np.ndarray]:
        return [tile_view(held.tile_file, i, s) for i, s in enumerate(held.tile_shapes)]

    # -- files --------------------------------------------------------------------
    def _remove_file(self, name: str) -> None:
        (self.cache_dir / name).unlink(missing_ok=True)

    def _disk_full(self, exc: OSError, nbytes: int) -> None:
        """The disk is full: stop writing for this cache's life, with one WARNING (lock held)."""
        self._persisting = False
        self._refused["full"] += 1
        if self._full_warned:
            return
        self._full_warned = True
        try:
            free = shutil.disk_usage(self.cache_dir).free
        except OSError:
            free = -1
        kept = (
            "chunks are no longer persisted for this dataset; the pass goes on and revives what is already there"
            if self.persist
            else "chunks are no longer spilled to disk for this dataset; the pool keeps them in memory, within "
            "cache_budget_bytes"
        )
        logger.warning(
            "insitubatch: cache_dir %r is full (%s) writing %d bytes with %d bytes free; %s. Free space (or set "
            "cache_disk_bytes below the disk's size): a new dataset over this cache_dir writes again.",
            str(self.cache_dir),
            os.strerror(exc.errno or errno.ENOSPC),
            nbytes,
            free,
            kept,
        )

    # -- observability ------------------------------------------------------
    @property
    def mapped_bytes(self) -> int:
        """Tile-file bytes this cache holds mapped now (held chunks and writes in progress)."""
        with self._lock:
            held = sum(m.nbytes for m in self._mapped.values())
            return held + sum(h.tile_file.n_tiles * h.tile_file.tile_bytes for h in self._pending.values())

    @property
    def revived(self) -> int:
        """Chunks mapped back from a persisted file by ``find``/``lookup``."""
        return self._revived

    @property
    def revived_from_others(self) -> int:
        """The part of ``revived`` whose file another writer made (another process, or an earlier run)."""
        return self._revived_others

    @property
    def written(self) -> int:
        """Chunks committed by this cache."""
        return self._written

    @property
    def rejected(self) -> dict[str, int]:
        """Logged entries ``lookup`` turned away, by reason (``shape``, ``dtype``, ``missing``, ``file``, ``checksum``)."""
        with self._lock:
            return dict(self._rejected)

    @property
    def dropped(self) -> dict[str, int]:
        """Log lines the load dropped, by reason (``stale``, ``superseded``, ``torn``)."""
        return dict(self._dropped)

    @property
    def refused(self) -> dict[str, int]:
        """Chunks ``begin`` did not write, by reason: ``full`` (disk), ``budget`` (``disk_bytes``), ``busy`` (claimed)."""
        with self._lock:
            return dict(self._refused)

    @property
    def persisting(self) -> bool:
        """False once a full disk stopped this cache writing."""
        return self._persisting

    def entries(self) -> dict[Key, LogEntry]:
        """The persisted entries this cache knows, keyed ``(array_path, chunk_index)``."""
        with self._lock:
            return dict(self._entries)

    @property
    def closed(self) -> bool:
        return self._closed


def now_ns() -> int:
    """A log line's ``t``: wall-clock ns, comparable between the writers of one host."""
    return time.time_ns()
