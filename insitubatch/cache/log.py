"""The persisted cache's append-only log: one JSON line per completed chunk, compacted on load.

``insitu_cache.jsonl``: line 1 is the header
``{"format": "insitubatch-cache", "version": 1}``; each further line is one
completed chunk::

    {"path": "t2m", "chunk": 5, "file": "cache-1a2b3c4d-5-t2m.npy",
     "n_tiles": 2, "tile_shapes": [[24, 10, 16], [24, 10, 4]],
     "dtype": "<f4", "fingerprint": "0123456789abcdef"}

``chunk`` is the global sample-axis chunk index, ``file`` a bare basename in
the cache directory, ``tile_shapes`` each tile's real (packed) shape,
``dtype`` numpy's ``.npy`` descr and ``fingerprint`` the 16-hex hash of the
chunk transforms scoped to the array (``fingerprint.pipeline_fingerprint``).
A later line for the same ``(path, chunk)`` supersedes an earlier one.

Each entry is appended with one ``write()`` of the whole line, newline last —
it is in the OS page cache, so it survives the death of the process (not a
power cut: nothing is fsynced per chunk). A *final* line without its newline
is a torn append from a process killed mid-write: ``read_log`` reports it and
the caller compacts. Anything else that does not parse — the header, an
interior line, a newline-terminated final line, an entry naming a file that is
not a bare ``.npy`` basename, two entries sharing a file — raises
``CacheCorruptError``. Compaction (``write_log``) writes a temporary file,
fsyncs it and renames it over the log.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CacheCorruptError
from .fingerprint import is_fingerprint

__all__ = [
    "LOG_FORMAT",
    "LOG_NAME",
    "LOG_VERSION",
    "Key",
    "LogContents",
    "LogEntry",
    "append_entry",
    "open_log",
    "read_log",
    "write_log",
]

LOG_NAME = "insitu_cache.jsonl"
LOG_FORMAT = "insitubatch-cache"
# Bump when an entry's fields change meaning; an older log then goes stale as a whole.
LOG_VERSION = 1
_ENTRY_KEYS = ("path", "chunk", "file", "n_tiles", "tile_shapes", "dtype", "fingerprint")
# Bytes of a malformed line quoted in an error: enough to recognise it, never a whole file.
_QUOTE_BYTES = 200

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
            text = line[:_QUOTE_BYTES].decode("utf-8", "replace")
            return CacheCorruptError(f"{where} is malformed ({why}): {text!r}")

        try:
            rec = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise bad(f"not JSON: {exc}") from None
        if not isinstance(rec, dict) or sorted(rec) != sorted(_ENTRY_KEYS):
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise bad(f"an entry is an object with keys {sorted(_ENTRY_KEYS)}, got {got}")
        path, chunk, name, n_tiles, shapes, descr, fp = (rec[k] for k in _ENTRY_KEYS)
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
        return cls(path, chunk, name, tuple(tuple(s) for s in shapes), dtype, fp)


def header_line() -> bytes:
    """The log's first line for this format version."""
    return (json.dumps({"format": LOG_FORMAT, "version": LOG_VERSION}, separators=(",", ":")) + "\n").encode()


@dataclass
class LogContents:
    """What ``read_log`` found: the header's version and, for this version, the live entries."""

    version: int
    entries: dict[Key, LogEntry]
    superseded: int = 0
    torn: bool = False


def read_log(log_path: Path) -> LogContents | None:
    """Parse the log at ``log_path``; ``None`` when there is none.

    Entries are returned only for this ``LOG_VERSION`` (another version's
    lines are not read), latest per key, in the order of their completion.

    Raises
    ------
    CacheCorruptError
        When the header or a complete line is malformed, or two entries share a file.
    """
    try:
        data = log_path.read_bytes()
    except FileNotFoundError:
        return None
    where = str(log_path)
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    if not lines:
        raise CacheCorruptError(f"{where} has no complete header line; it is not an insitubatch cache log")
    try:
        header = json.loads(lines[0])
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    is_header = isinstance(header, dict) and header.get("format") == LOG_FORMAT
    if not is_header or not _nonneg_int(header.get("version")):
        raise CacheCorruptError(
            f"{where} line 1 is not an insitubatch cache header (want {header_line().decode().strip()}): "
            f"{lines[0][:_QUOTE_BYTES].decode('utf-8', 'replace')!r}"
        )
    contents = LogContents(header["version"], {}, torn=bool(torn))
    if contents.version != LOG_VERSION:
        return contents
    files: dict[str, Key] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        entry = LogEntry.from_line(line, f"{where} line {lineno}")
        if files.get(entry.file, entry.key) != entry.key:
            raise CacheCorruptError(
                f"{where} line {lineno}: file {entry.file!r} is claimed by both {files[entry.file]} and {entry.key}"
            )
        files[entry.file] = entry.key
        if entry.key in contents.entries:
            contents.superseded += 1
            del contents.entries[entry.key]  # re-insert so the order is that of the latest completion
        contents.entries[entry.key] = entry
    return contents


def write_log(log_path: Path, entries: list[LogEntry]) -> None:
    """Write the header and ``entries`` to a temporary file, fsync it and rename it over the log."""
    body = header_line() + b"".join(e.to_line() for e in entries)
    tmp = log_path.with_name(f".{log_path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, body)
        os.fsync(fd)  # a rewrite drops lines, so it must not be half there after a crash
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, log_path)


def open_log(log_path: Path) -> int:
    """A close-on-exec append descriptor of the log (the caller owns it)."""
    return os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)


def append_entry(fd: int, entry: LogEntry) -> None:
    """Append one entry as a single ``write`` of its whole line."""
    _write_all(fd, entry.to_line())


def _write_all(fd: int, data: bytes) -> None:
    """``write`` until every byte is out (a regular file takes it in one call unless the disk fills)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
