"""Every writer's log lines of one cache directory: the compacted base log plus one segment per writer.

Writers never share a file they append to. Each appends to its own segment,
``insitu_cache.d/<writer>.jsonl``, which it created (header first, under a
temporary name, renamed into place) while it held the gate, and on which it
holds an exclusive ``flock`` until it closes (``lock``). A reader of the
ledger therefore sees, per segment, a header and complete lines, plus at
most one unterminated line at the end: one being appended right now (the
writer is alive: it is read once complete) or a torn one (the writer died, or
its disk filled: it is never an entry).

``load`` reads the base log and every segment; ``refresh`` reads what other
writers appended since (and segments that appeared), so a chunk another
process finished mid-run is revived rather than fetched again. ``compact``
— called only by a writer that found itself alone under the gate — folds
everything into the base log (temporary file, fsync, rename) and deletes the
segments of dead writers.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CacheCorruptError
from .files import SEGMENT_FILE, SEGMENT_SUFFIX, SHARED_DIR
from .lock import HolderRecord, try_lock
from .log import (
    LOG_NAME,
    LOG_VERSION,
    Key,
    LogEntry,
    append_entry,
    header_line,
    parse_header,
    parse_lines,
    write_all,
    write_log,
)

__all__ = ["Ledger", "Loaded"]

logger = logging.getLogger("insitubatch")


@dataclass
class Loaded:
    """What ``Ledger.load`` found."""

    version: int  # the base log's (or a segment's) format version; LOG_VERSION when there is no log yet
    entries: dict[Key, LogEntry] = field(default_factory=dict)  # the latest line per chunk
    superseded: int = 0  # lines a later line of the same chunk replaced
    torn: int = 0  # unterminated final lines of dead writers' segments (and of the base log)
    segments: list[str] = field(default_factory=list)  # every segment's name, the live ones' too
    base_exists: bool = False


class Ledger:
    """The base log and the segments of ``cache_dir``, as one writer or reader sees them."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.base_path = cache_dir / LOG_NAME
        self.shared_dir = cache_dir / SHARED_DIR
        self.segment_name: str | None = None  # this writer's own, once registered
        self._fd: int | None = None
        self._size = 0  # bytes of our own segment: a failed append is cut back to it
        self._header_size = 0
        self._writable = False  # its header is written: lines may follow
        self._read: dict[str, int] = {}  # other segments: bytes consumed so far
        self._broken: set[str] = set()  # segments that went bad mid-run: no longer read
        self._finished: set[str] = set()  # segments of writers already dead at load: read once

    # -- reading ------------------------------------------------------------------
    def segment_names(self) -> list[str]:
        try:
            names = os.listdir(self.shared_dir)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if SEGMENT_FILE.match(n))

    def load(self, live: Iterable[str]) -> Loaded:
        """Read the base log and every segment; ``live`` names the live writers' segments.

        Raises
        ------
        CacheCorruptError
            A header or a complete line is malformed; the message names the file and line.
        """
        live = set(live)
        out = Loaded(LOG_VERSION)
        lines: list[LogEntry] = []
        try:
            data = self.base_path.read_bytes()
        except FileNotFoundError:
            pass
        else:
            out.base_exists = True
            version, parsed_lines, tail = self._parse(data, str(self.base_path))
            if version != LOG_VERSION:
                out.version = version
                return out
            lines += parsed_lines
            out.torn += tail > 0
        for name in self.segment_names():
            out.segments.append(name)
            path = self.shared_dir / name
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # compacted away by a writer that was alone: we are not, so cannot be
                continue
            alive = name in live
            if not alive:
                self._finished.add(name)  # a dead writer's segment never grows: not read again
            if b"\n" not in data:  # no header yet: a registration that failed (a full disk) or is in progress
                out.torn += not alive and bool(data)
                self._read[name] = 0
                continue
            version, parsed_lines, tail = self._parse(data, str(path))
            if version != LOG_VERSION:
                out.version = version
                return out
            lines += parsed_lines
            out.torn += tail > 0 and not alive
            self._read[name] = len(data) - tail
        owners: dict[str, Key] = {}
        for e in lines:
            if owners.setdefault(e.file, e.key) != e.key:
                raise CacheCorruptError(
                    f"the cache logs of {self.cache_dir} ({LOG_NAME} and {SHARED_DIR}/) name file {e.file!r} for "
                    f"both {owners[e.file]} and {e.key}"
                )
            old = out.entries.get(e.key)
            if old is None or e.t >= old.t:
                out.entries[e.key] = e
            out.superseded += old is not None
        return out

    @staticmethod
    def _parse(data: bytes, where: str) -> tuple[int, list[LogEntry], int]:
        """``(version, entries, unterminated tail bytes)`` of a whole log file."""
        end = data.find(b"\n")
        if end < 0:
            raise CacheCorruptError(f"{where} has no complete header line; it is not an insitubatch cache log")
        version = parse_header(data[:end], where)["version"]
        if version != LOG_VERSION:
            return version, [], 0
        parsed = parse_lines(data[end + 1 :], where, first_lineno=2)
        return version, parsed.entries, parsed.tail

    def refresh(self) -> list[LogEntry]:
        """Lines other writers completed since the last look (segments that appeared included).

        A segment that turns out malformed mid-run is reported once and no
        longer read: another writer's damage never stops this one.
        """
        new: list[LogEntry] = []
        for name in self.segment_names():
            if name == self.segment_name or name in self._broken or name in self._finished:
                continue
            path = self.shared_dir / name
            start = self._read.get(name, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except FileNotFoundError:
                continue
            first = 0
            if start == 0:  # the header first
                end = data.find(b"\n")
                if end < 0:
                    continue
                first = end + 1
            try:
                if start == 0 and parse_header(data[: first - 1], str(path))["version"] != LOG_VERSION:
                    raise CacheCorruptError(f"{path} is a log of another format version")
                parsed = parse_lines(data[first:], str(path), first_lineno=2)
            except CacheCorruptError as exc:
                self._broken.add(name)
                logger.warning("insitubatch: no longer reading another writer's cache log: %s", exc)
                continue
            self._read[name] = start + first + parsed.consumed
            new += parsed.entries
        return new

    def holder(self, name: str) -> HolderRecord | None:
        """The writer record in segment ``name``'s header, or None when it has none (yet)."""
        try:
            with open(self.shared_dir / name, "rb") as f:
                line = f.readline()
            header = parse_header(line.rstrip(b"\n"), name) if line.endswith(b"\n") else None
        except (OSError, CacheCorruptError):
            return None
        return header

    # -- this writer's segment -------------------------------------------------------
    def register(self, token: str, record: HolderRecord, fds: list[int]) -> None:
        """Create this writer's segment, locked, with its header (hold the gate while calling).

        The segment is written under a temporary name and renamed, so nobody
        sees it without its header. Its descriptor joins ``fds``.

        Raises
        ------
        OSError
            ``ENOSPC``/``EDQUOT`` when the header cannot be written: the
            segment is registered (locked, so this writer counts as alive)
            but empty, and nothing may be appended to it.
        """
        self.shared_dir.mkdir(exist_ok=True)
        name = token + SEGMENT_SUFFIX
        tmp = self.shared_dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        fds.append(fd)
        self._fd = fd
        self.segment_name = name
        if not try_lock(fd, shared=False):  # a fresh file nobody else can know yet
            raise RuntimeError(f"could not lock the new cache log segment {tmp}")
        header = header_line(**record)
        try:
            write_all(fd, header)
        except OSError:
            os.ftruncate(fd, 0)
            raise
        else:
            self._size = self._header_size = len(header)
            self._writable = True
        finally:
            os.replace(tmp, self.shared_dir / name)  # registered either way: its lock says this writer is alive

    def append(self, entry: LogEntry) -> None:
        """Append one line to this writer's segment.

        Raises
        ------
        OSError
            The write failed (a full disk); a partial line was cut off again,
            so the segment stays well-formed.
        """
        if self._fd is None or not self._writable:
            raise OSError(errno.ENOSPC, "this writer's log segment has no header (its disk was full)")
        try:
            append_entry(self._fd, entry)
        except OSError:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass  # the line stays torn: readers skip an unterminated final line
            raise
        self._size += len(entry.to_line())

    @property
    def appended(self) -> bool:
        """Whether this writer's segment holds any entry."""
        return self._writable and self._size > self._header_size

    def close(self, fds: list[int]) -> None:
        """Drop this writer's lock on its segment; a segment with no entry is deleted."""
        name, fd = self.segment_name, self._fd
        if name is not None and fd is not None and not self.appended:
            (self.shared_dir / name).unlink(missing_ok=True)  # unlinked while still ours
        if fd is not None:
            self._fd = None
            self._writable = False
            if fd in fds:
                fds.remove(fd)
                os.close(fd)

    # -- compaction (only by a writer alone under the gate) ----------------------------
    def compact(self, entries: Iterable[LogEntry], segments: Iterable[str]) -> None:
        """Write ``entries`` as the base log, then delete ``segments`` (all of them dead)."""
        write_log(self.base_path, list(entries))
        for name in segments:
            (self.shared_dir / name).unlink(missing_ok=True)
            self._read.pop(name, None)
