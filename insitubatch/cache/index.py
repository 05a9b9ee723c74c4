"""``CacheIndex``: what ``cache_dir``'s logs say, as one ``DiskCache`` knows it, and opening the directory.

The index holds the latest logged entry of every chunk (whoever logged it),
which of those lines this writer appended, and every logged file's size (the
disk budget). It is loaded once, at admission, and takes in the lines other
writers appended since on ``refresh``; ``log`` appends this writer's own.

Opening as a writer holds the gate exclusively throughout (``lock``): the
writer finds which other writers are alive (their segments are locked),
deletes what dead writers left half-done (temporary files, spill files),
loads every log, and registers its own segment. Only a writer that finds
itself *alone* changes what others could be reading: it compacts the logs
into the base log, deletes files no entry names, and applies
``reset_stale``. With other writers alive those wait for a later opener that
is alone — except ``reset_stale``, which must delete files now and so
raises ``CacheLockedError`` naming the writers in the way.

Not thread-safe on its own: the ``DiskCache`` calls it under its lock.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from ..errors import CacheLockedError, StaleCacheError
from .files import CLAIM_FILE, DROP_STALE, DROP_SUPERSEDED, DROP_TORN, OWNED_TEMP, OWNED_TILE_FILE, SEGMENT_TEMP
from .ledger import Ledger, Loaded
from .lock import HolderRecord, holder_record, open_gate, probe, sign_gate, unlock, writers_message
from .log import LOG_VERSION, Key, LogEntry
from .options import CacheOptions
from .space import FULL_ERRNOS, DiskSpace

__all__ = ["CacheIndex"]


class CacheIndex:
    """The logged entries of one cache directory as this process knows them; opens the directory.

    Parameters
    ----------
    options
        The cache's options (checked: an instance is a valid combination);
        ``options.cache_dir`` is set.
    fingerprints
        ``{name: 16-hex pipeline fingerprint}`` of every array this run
        caches (checked by ``DiskCache``).
    space
        Told when the disk fills while registering or compacting.
    fds
        The cache's open descriptors (closed on collection): the gate's,
        while it is held, and the segment's.
    """

    def __init__(
        self, options: CacheOptions, fingerprints: Mapping[str, str], *, space: DiskSpace, fds: list[int]
    ) -> None:
        assert options.cache_dir is not None  # a DiskCache is only built over a directory
        self.cache_dir: Path = options.cache_dir
        self.options = options
        self.fingerprints = dict(fingerprints)
        self._ledger = Ledger(self.cache_dir)
        self._space = space
        self._fds = fds
        self._entries: dict[Key, LogEntry] = {}
        self._own: set[tuple[Key, int]] = set()  # (key, t) of the lines this writer appended
        self._file_bytes: dict[str, int] = {}  # every logged file's size, whoever wrote it (the disk budget)
        self._dropped: Counter[str] = Counter()
        self._last_refresh = 0.0

    # -- opening ------------------------------------------------------------------
    def open_as_writer(self, token: str) -> None:
        """Admission under the exclusive gate: tidy, load, register (see the module docstring)."""
        fd = open_gate(self.cache_dir, shared=False, writable=True)
        self._fds.append(fd)
        try:
            record = holder_record(token)
            sign_gate(fd, record)
            live = self._live_writers()
            self._tidy(live)
            if self.options.persist:
                self._load(live)
            try:
                self._ledger.register(token, record, self._fds)
            except OSError as exc:
                if exc.errno not in FULL_ERRNOS:
                    raise
                self._space.stop(exc, len(str(record)))
        finally:
            self._fds.remove(fd)
            os.close(fd)  # lets the next opener in

    def open_as_reader(self) -> None:
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
            m = OWNED_TEMP.match(name)
            if m is not None and (alone or m.group("tag") not in tokens):
                self._remove_file(name)
                continue
            m = OWNED_TILE_FILE.match(name)
            if m is not None and name.startswith("spill-") and (alone or m.group("spiller") not in tokens):
                self._remove_file(name)
        shared = self._ledger.shared_dir
        if not shared.is_dir():
            return
        for name in os.listdir(shared):
            # a segment temp is an admission that died (ours holds the gate); a claim is a dead writer's when alone
            if SEGMENT_TEMP.match(name) or (alone and CLAIM_FILE.match(name)):
                (shared / name).unlink(missing_ok=True)

    def _load(self, live: Mapping[str, HolderRecord | None]) -> None:
        """Read every log; drop stale entries (or raise); compact and delete orphans when alone."""
        alone = not live and not self.options.readonly
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
        if stale and not self.options.reset_stale:
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
        if self.options.readonly:
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
            if exc.errno not in FULL_ERRNOS:
                raise
            self._space.stop(exc, 0)
            return
        named = {e.file for e in self._entries.values()}
        for name in os.listdir(self.cache_dir):
            if OWNED_TILE_FILE.match(name) and name not in named:
                self._remove_file(name)

    def _reset_other_version(self, loaded: Loaded, live: Mapping[str, HolderRecord | None]) -> None:
        """A log of another format version: nothing in it can be read, so every entry is stale."""
        where = self._ledger.base_path if loaded.base_exists else self._ledger.shared_dir
        if not self.options.reset_stale:
            raise StaleCacheError(
                f"{where} is cache log format version {loaded.version}; this insitubatch reads version "
                f"{LOG_VERSION}. {self._stale_advice('delete the whole cache and rebuild it')}"
            )
        if live:
            raise CacheLockedError(
                errno.EAGAIN, writers_message(self.cache_dir, live, wanted="reset it (reset_stale_cache=True)")
            )
        for name in os.listdir(self.cache_dir):
            if OWNED_TILE_FILE.match(name):
                self._remove_file(name)
        self._dropped[DROP_STALE] += 1
        self._entries = {}
        self._file_bytes = {}
        self._ledger.compact([], self._ledger.segment_names())

    def _remove_file(self, name: str) -> None:
        (self.cache_dir / name).unlink(missing_ok=True)

    # -- reading and writing entries ----------------------------------------------
    def fingerprint(self, path: str) -> str:
        """The pipeline fingerprint of array ``path``; ``KeyError`` naming the covered arrays when it has none."""
        try:
            return self.fingerprints[path]
        except KeyError:
            raise KeyError(
                f"array {path!r} has no fingerprint; DiskCache(fingerprints=...) covers {sorted(self.fingerprints)}"
            ) from None

    def entry(self, key: Key) -> LogEntry | None:
        """The latest logged entry of the chunk ``key``, as this cache last read the logs."""
        return self._entries.get(key)

    def refresh(self, *, every: float = 0.0) -> None:
        """Take in the lines other writers logged since the last look, if that was more than ``every`` s ago."""
        if self.options.readonly or not self.options.persist:
            return
        if every and time.monotonic() - self._last_refresh <= every:
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

    def log(self, entry: LogEntry) -> None:
        """Append this writer's line for a committed chunk, unless the log already holds the same entry.

        Raises
        ------
        OSError
            The append failed (``FULL_ERRNOS``: the disk is full); the index is unchanged.
        """
        current = self._entries.get(entry.key)
        if current is not None and dataclasses.replace(entry, t=current.t) == current:
            return  # the log has it
        self._ledger.append(entry)
        self._entries[entry.key] = entry
        self._own.add((entry.key, entry.t))
        self._file_bytes[entry.file] = entry.nbytes

    def made_here(self, entry: LogEntry) -> bool:
        """Whether this writer appended ``entry``'s line (else another writer, or an earlier run, made it)."""
        return (entry.key, entry.t) in self._own

    def logged_bytes(self, *, besides: str | None = None) -> int:
        """Bytes of the tile files every writer logged, leaving out the file named ``besides``."""
        total = sum(self._file_bytes.values())
        return total - self._file_bytes.get(besides, 0) if besides is not None else total

    def entries(self) -> dict[Key, LogEntry]:
        """A copy of the logged entries, keyed ``(array_path, chunk_index)``."""
        return dict(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def shared_dir(self) -> Path:
        """``cache_dir``'s shared directory: the writers' segments and the claims."""
        return self._ledger.shared_dir

    @property
    def log_path(self) -> Path:
        """The compacted base log."""
        return self._ledger.base_path

    def close(self) -> None:
        """Let go of this writer's segment (deleted when it logged nothing). Idempotent."""
        self._ledger.close(self._fds)

    @property
    def dropped(self) -> dict[str, int]:
        """Log lines the load dropped, by reason (``stale``, ``superseded``, ``torn``)."""
        return dict(self._dropped)
