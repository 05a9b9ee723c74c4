"""The persisted cache's log lines: one JSON line per completed chunk, behind a header.

The same line format serves the compacted base log ``insitu_cache.jsonl``
and every writer's segment ``insitu_cache.d/<writer>.jsonl`` (``ledger``
reads them together). Line 1 is the header: the base log's is
``{"format": "insitubatch-cache", "version": 2}``; a segment's adds who
writes it (``writer``, ``pid``, ``host``, ``since``). Each further line is
one completed chunk::

    {"path": "t2m", "chunk": 5, "file": "cache-1a2b3c4d-0123456789abcdef-5-t2m.npy",
     "n_tiles": 2, "tile_shapes": [[24, 10, 16], [24, 10, 4]], "dtype": "<f4",
     "fingerprint": "0123456789abcdef", "nbytes": 30848, "crc32c": 2914561281,
     "t": 1718000000123456789}

``chunk`` is the global sample-axis chunk index, ``file`` a bare basename in
the cache directory, ``tile_shapes`` each tile's real (packed) shape,
``dtype`` numpy's ``.npy`` descr, ``fingerprint`` the 16-hex hash of the
chunk transforms scoped to the array (``fingerprint.array_fingerprints``),
``nbytes`` the file's size, ``crc32c`` the CRC-32C of the whole file
(header and payload), and ``t`` when it was committed (ns since the epoch):
of two lines for one ``(path, chunk)`` the later ``t`` wins. Writes of one
chunk are serialized by its claim, so the later line names the file that
is there now.

Each line is appended with one ``write()`` of the whole line, newline last,
after its file was published. A final line without its newline is a torn
append (its writer was killed mid-write, or the disk filled): it is not an
entry. Anything else that does not parse — a header, an interior line, an
entry naming a file that is not a bare ``.npy`` basename — raises
``CacheCorruptError``. ``write_log`` (compaction) writes a temporary file,
fsyncs it and renames it over the base log.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CacheCorruptError
from .fingerprint import is_fingerprint

__all__ = [
    "LOG_FORMAT",
    "LOG_NAME",
    "LOG_VERSION",
    "Key",
    "LogEntry",
    "Parsed",
    "append_entry",
    "header_line",
    "parse_header",
    "parse_lines",
    "write_log",
]

LOG_NAME = "insitu_cache.jsonl"
LOG_FORMAT = "insitubatch-cache"
# Bump when an entry's fields change meaning; an older log then goes stale as a whole.
# 2: per-writer segments, the fingerprint in persisted file names, nbytes, crc32c and t per entry.
LOG_VERSION = 2
_ENTRY_KEYS = ("path", "chunk", "file", "n_tiles", "tile_shapes", "dtype", "fingerprint", "nbytes", "crc32c", "t")
# Bytes of a malformed line quoted in an error: enough to recognise it, never a whole file.
_QUOTE_BYTES = 200
# CRC-32C values are unsigned 32-bit integers.
_CRC_LIMIT = 1 << 32

Key = tuple[str, int]


def _is_bare_npy_basename(name: str) -> bool:
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and os.path.basename(name) == name
        and name.endswith(".npy")
    )


def _nonneg_int(v: object) -> bool:
    return type(v) is int and v >= 0


@dataclass(frozen=True)
class LogEntry:
    """One completed chunk as the log records it (see the module docstring for the line format)."""

    path: str
    chunk_index: int
    file: str
    tile_shapes: tuple[tuple[int, ...], ...]
    dtype: np.dtype
    fingerprint: str
    nbytes: int
    crc32c: int
    t: int

    @property
    def key(self) -> Key:
        return (self.path, self.chunk_index)

    @property
    def n_tiles(self) -> int:
        return len(self.tile_shapes)

    def to_line(self) -> bytes:
        """The entry as one newline-terminated JSON line."""
        record = {
            "path": self.path,
            "chunk": self.chunk_index,
            "file": self.file,
            "n_tiles": self.n_tiles,
            "tile_shapes": [list(s) for s in self.tile_shapes],
            "dtype": np.lib.format.dtype_to_descr(self.dtype),
            "fingerprint": self.fingerprint,
            "nbytes": self.nbytes,
            "crc32c": self.crc32c,
            "t": self.t,
        }
        return (json.dumps(record, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes, where: str) -> LogEntry:
        """Parse and validate one log line; ``where`` names it in the error.

        Raises
        ------
        CacheCorruptError
            When the line is not a JSON object with exactly the entry's fields,
            each of the right type, or its file is not a bare ``.npy`` basename.
        """

        def bad(why: str) -> CacheCorruptError:
            return CacheCorruptError(f"{where} is malformed ({why}): {_quote(line)!r}")

        try:
            rec = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise bad(f"not JSON: {exc}") from None
        if not isinstance(rec, dict) or sorted(rec) != sorted(_ENTRY_KEYS):
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise bad(f"an entry is an object with keys {sorted(_ENTRY_KEYS)}, got {got}")
        path, chunk, name, n_tiles, shapes, descr, fp, nbytes, crc, t = (rec[k] for k in _ENTRY_KEYS)
        if not isinstance(path, str) or not path:
            raise bad(f"path must be a non-empty string, got {path!r}")
        if not _nonneg_int(chunk):
            raise bad(f"chunk must be an integer >= 0, got {chunk!r}")
        if not isinstance(name, str) or not _is_bare_npy_basename(name):
            raise bad(f"file must be a bare .npy basename inside the cache directory, got {name!r}")
        if not _nonneg_int(n_tiles):
            raise bad(f"n_tiles must be an integer >= 0, got {n_tiles!r}")
        if (
            not isinstance(shapes, list)
            or len(shapes) != n_tiles
            or not all(isinstance(s, list) and s and all(_nonneg_int(x) for x in s) for s in shapes)
            or len({len(s) for s in shapes}) > 1
        ):
            raise bad(f"tile_shapes must be {n_tiles} lists of equally many integers >= 0, got {shapes!r}")
        try:
            dtype = np.lib.format.descr_to_dtype(descr)
        except (TypeError, ValueError, KeyError) as exc:
            raise bad(f"dtype {descr!r} is not a numpy descr: {exc}") from None
        if dtype.hasobject or dtype.itemsize == 0:
            raise bad(f"dtype {dtype} cannot live in a tile file")
        if not is_fingerprint(fp):
            raise bad(f"fingerprint must be 16 lowercase hex digits, got {fp!r}")
        if not _nonneg_int(nbytes):
            raise bad(f"nbytes must be an integer >= 0, got {nbytes!r}")
        if not _nonneg_int(crc) or crc >= _CRC_LIMIT:
            raise bad(f"crc32c must be an unsigned 32-bit integer, got {crc!r}")
        if not _nonneg_int(t):
            raise bad(f"t must be an integer >= 0 (ns), got {t!r}")
        return cls(path, chunk, name, tuple(tuple(s) for s in shapes), dtype, fp, nbytes, crc, t)


def _quote(line: bytes) -> str:
    return line[:_QUOTE_BYTES].decode("utf-8", "replace")


def header_line(**who: Any) -> bytes:
    """The first line of a log for this format version; ``who`` adds a segment's writer record."""
    return (json.dumps({"format": LOG_FORMAT, "version": LOG_VERSION, **who}, separators=(",", ":")) + "\n").encode()


def parse_header(line: bytes, where: str) -> dict:
    """The header's fields (``version`` among them, maybe another version's).

    Raises
    ------
    CacheCorruptError
        When the line is not an insitubatch cache header.
    """
    try:
        header = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or header.get("format") != LOG_FORMAT or not _nonneg_int(header.get("version")):
        raise CacheCorruptError(
            f"{where} line 1 is not an insitubatch cache header (want {header_line().decode().strip()}): "
            f"{_quote(line)!r}"
        )
    return header


@dataclass
class Parsed:
    """Complete lines parsed from a log's bytes: the entries in order, and how many bytes they used."""

    entries: list[LogEntry]
    consumed: int  # bytes up to and including the last complete line parsed
    tail: int  # bytes after it: a line still being appended, or a torn one


def parse_lines(data: bytes, where: str, first_lineno: int) -> Parsed:
    """Parse the complete (newline-terminated) entry lines of ``data``; a final unterminated line is left as ``tail``.

    Raises
    ------
    CacheCorruptError
        When a complete line is malformed (``where`` and the line number name it).
    """
    end = data.rfind(b"\n") + 1
    entries = [
        LogEntry.from_line(line, f"{where} line {lineno}")
        for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=first_lineno)
    ]
    return Parsed(entries, end, len(data) - end)


def write_log(log_path: Path, entries: list[LogEntry]) -> None:
    """Write the base header and ``entries`` to a temporary file, fsync it and rename it over ``log_path``."""
    body = header_line() + b"".join(e.to_line() for e in entries)
    tmp = log_path.with_name(f".{log_path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, body)
        os.fsync(fd)  # a rewrite drops lines, so it must not be half there after a crash
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, log_path)


def append_entry(fd: int, entry: LogEntry) -> None:
    """Append one entry as a single ``write`` of its whole line (``fd`` is opened ``O_APPEND``)."""
    write_all(fd, entry.to_line())


def write_all(fd: int, data: bytes) -> None:
    """``write`` until every byte is out (a regular file takes it in one call unless the disk fills)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
