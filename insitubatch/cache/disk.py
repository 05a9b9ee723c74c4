"""``DiskCache``: the mmap tier of the chunk pool, optionally persisted across runs.

One ``DiskCache`` serves one dataset over one ``cache_dir``. Every chunk slot
it holds is a tile-major ``.npy`` file (see ``kernels.SlotFile``) written under
a temporary name and renamed into place, so a file under its final name is
always complete, and a mapping another process holds keeps its own inode.

Without ``persist`` the directory is ephemeral spill: files are unlinked on
eviction and on close. With ``persist`` an append-only log records each
completed chunk the moment it lands, and a later ``DiskCache`` over the same
directory revives those chunks as zero-copy read-only views.

Files in ``cache_dir``
----------------------
``insitu_cache.lock``
    The advisory ``flock`` target, held for the object's lifetime: exclusive
    for a writer (which records its PID and host in the file), shared for a
    ``readonly`` reader. Never deleted: deleting it would make the next two
    processes lock different inodes. The kernel drops the lock when its holder
    dies, SIGKILL included, so there is no stale lock to clean up. The fd is
    close-on-exec, but a *forked* child shares the lock until it exits.
``insitu_cache.jsonl``
    The log (``persist`` only). Line 1 is the header
    ``{"format": "insitubatch-cache", "version": 1}``; each further line is
    one completed chunk::

        {"path": "t2m", "chunk": 5, "file": "cache-1a2b3c4d-5-t2m.npy",
         "n_tiles": 2, "tile_shapes": [[24, 10, 16], [24, 10, 4]],
         "dtype": "<f4", "fingerprint": "0123456789abcdef"}

    ``chunk`` is the global sample-axis chunk index, ``file`` a bare basename in
    ``cache_dir``, ``tile_shapes`` each tile's real (packed) shape, ``dtype``
    numpy's ``.npy`` descr and ``fingerprint`` the 16-hex hash of the chunk
    transforms scoped to the array (``fingerprint.pipeline_fingerprint``).
    A later line for the same ``(path, chunk)`` supersedes an earlier one.
``cache-<hash>-<chunk>-<slug>.npy`` / ``spill-…npy``
    Slot files of persisted / ephemeral chunks. Ephemeral files have their own
    names, so a spill run never clobbers a persisted entry.

Log rules
---------
Each entry is appended with one ``write()`` of the whole line, newline last,
before ``commit`` returns — it is in the OS page cache, so it survives the
death of the process (not a power cut: nothing is fsynced per chunk).

On open, a *final* line without its newline is a torn append from a process
killed mid-write: it is dropped (its chunk is simply re-made) and the log is
compacted. Anything else that does not parse — the header, an interior line,
a newline-terminated final line, an entry naming a file that is not a bare
``.npy`` basename, two entries sharing a file — raises ``CacheCorruptError``,
whatever ``reset_stale`` says. A well-formed header of another format
version makes every entry stale.

Entries whose fingerprint differs from ``fingerprints[path]`` are stale:
``StaleCacheError`` names the arrays unless ``reset_stale=True``, which
deletes those arrays' files and entries. Entries for arrays missing from
``fingerprints`` are kept untouched. The log is rewritten (temp + rename) only
when a load dropped entries (stale, superseded, torn).

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

import errno
import fcntl
import hashlib
import json
import operator
import os
import re
import secrets
import socket
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CacheCorruptError, CacheLockedError, CacheMissError, StaleCacheError
from .fingerprint import is_fingerprint
from ..kernels import SlotFile, create_slot_file, open_slot_file, tile_view, write_tile

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
    "slot_basename",
]

LOG_NAME = "insitu_cache.jsonl"
LOCK_NAME = "insitu_cache.lock"
LOG_FORMAT = "insitubatch-cache"
# Bump when an entry's fields change meaning; an older log then goes stale as a whole.
LOG_VERSION = 1
_PERSIST_PREFIX, _SPILL_PREFIX = "cache", "spill"
# Bytes of the array path's hash in a slot file name (8 hex digits; the slug keeps names readable).
_NAME_HASH_BYTES = 4
# Longest array-path slug in a slot file name, well inside NAME_MAX (255).
_SLUG_MAX = 64
_OWNED_SLOT = re.compile(rf"^({_PERSIST_PREFIX}|{_SPILL_PREFIX})-[0-9a-f]{{8}}-\d+-[A-Za-z0-9_.-]+\.npy$")
# create_slot_file(temp=True) and our compaction write ".<name>.<pid>-<hex>.tmp" next to the target.
_OWNED_TEMP = re.compile(
    rf"^\.(({_PERSIST_PREFIX}|{_SPILL_PREFIX})-.*\.npy|{re.escape(LOG_NAME)})\.\d+-[0-9a-f]+\.tmp$"
)
_ENTRY_KEYS = ("path", "chunk", "file", "n_tiles", "tile_shapes", "dtype", "fingerprint")
_MOUNTS = Path("/proc/mounts")
# Filesystems where flock is per client (or emulated), so two hosts can both "hold" it.
_NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "afs", "gpfs",
                         "beegfs", "fuse"})
_NETWORK_FS_PREFIXES = ("fuse.",)
# Reasons ``lookup`` turns a logged entry away (``rejected``) and a load drops one (``dropped``).
REJECT_SHAPE, REJECT_DTYPE, REJECT_MISSING, REJECT_FILE = "shape", "dtype", "missing", "file"
DROP_STALE, DROP_SUPERSEDED, DROP_TORN = "stale", "superseded", "torn"

Key = tuple[str, int]


# ---------------------------------------------------------------------------
# names and the log entry


def slot_basename(path: str, chunk_index: int, *, persist: bool) -> str:
    """The slot file name of ``(path, chunk_index)``: deterministic, a bare basename.

    ``cache-…`` for persisted chunks, ``spill-…`` for ephemeral ones. The array
    path's hash keeps two paths with the same slug apart.
    """
    digest = hashlib.blake2b(path.encode(), digest_size=_NAME_HASH_BYTES).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", path).strip("._")[:_SLUG_MAX] or "array"
    return f"{_PERSIST_PREFIX if persist else _SPILL_PREFIX}-{digest}-{int(chunk_index)}-{slug}.npy"


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
            text = line[:200].decode("utf-8", "replace")
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
            raise bad(f"dtype {dtype} cannot live in a slot file")
        if not is_fingerprint(fp):
            raise bad(f"fingerprint must be 16 lowercase hex digits, got {fp!r}")
        return cls(path, chunk, name, tuple(tuple(s) for s in shapes), dtype, fp)


def _header_line() -> bytes:
    return (json.dumps({"format": LOG_FORMAT, "version": LOG_VERSION}, separators=(",", ":")) + "\n").encode()


# ---------------------------------------------------------------------------
# network filesystems


def network_filesystem(path: str | os.PathLike, mounts: str | os.PathLike | None = None) -> str | None:
    """The filesystem type of ``path``'s mount when it is a network or FUSE one, else ``None``.

    Reads the mount table (``mounts``, default ``/proc/mounts``); ``None`` where there is none.
    """
    target = os.path.realpath(path)
    try:
        text = Path(_MOUNTS if mounts is None else mounts).read_text()
    except OSError:
        return None
    best, best_type = "", None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # the mount table escapes space, tab, newline and backslash as octal
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    if best_type is not None and (best_type in _NETWORK_FS or best_type.startswith(_NETWORK_FS_PREFIXES)):
        return best_type
    return None


# ---------------------------------------------------------------------------
# the cache


@dataclass(eq=False)
class WriteHandle:
    """A chunk being written by ``DiskCache.begin``: its slot file under a temporary name."""

    key: Key
    slot_file: SlotFile
    written: set[int] = field(default_factory=set)
    done: bool = False


@dataclass(eq=False)
class _Mapped:
    """A slot file this cache holds mapped, with the tile shapes it was mapped for."""

    slot_file: SlotFile
    tile_shapes: tuple[tuple[int, ...], ...]

    @property
    def nbytes(self) -> int:
        return self.slot_file.n_tiles * self.slot_file.slot_bytes


def _release_fds(fds: list[int]) -> None:
    """Close the cache's descriptors (the lock goes with its fd); run by ``close`` or at collection."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


class DiskCache:
    """The mmap-backed chunk cache of one dataset over one ``cache_dir``.

    Parameters
    ----------
    cache_dir
        Directory of the slot files, the log and the lock file; created for a
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
            self._acquire_lock()
            if not self.readonly:
                self._remove_temp_files()
            if self.persist:
                self._load_log()
            if not self.readonly:
                self._remove_orphans()
        except BaseException:
            self._finalizer()
            raise

    # -- lock ---------------------------------------------------------------

    def _acquire_lock(self) -> None:
        flags = os.O_CLOEXEC | (os.O_RDONLY if self.readonly else os.O_RDWR)
        try:
            fd = os.open(self.lock_path, flags)
        except FileNotFoundError:
            # the one file a readonly cache may create: without it, no writer could be excluded
            fd = os.open(self.lock_path, flags | os.O_CREAT, 0o644)
        self._fds.append(fd)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise CacheLockedError(exc.errno, self._holder_message(fd)) from None
        if not self.readonly:
            record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            data = (json.dumps(record) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def _holder_message(self, fd: int) -> str:
        """Who holds the lock: a writer (from the lock file) or readonly readers."""
        where = str(self.cache_dir)
        if not self.readonly:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                pass  # an exclusive holder: a writer
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return (
                    f"cache_dir {where!r} is open by readonly readers (readonly_cache=True), which exclude "
                    "writers; wait for them to finish or write to another cache_dir"
                )
        try:
            holder = json.loads(os.pread(fd, 4096, 0))
            who = f"PID {holder['pid']} on host {holder['host']} (since {holder.get('since', '?')})"
        except (OSError, ValueError, KeyError, TypeError):
            who = "a process that has not recorded its PID and host yet"
        want = "read it" if self.readonly else "write it"
        return (
            f"cache_dir {where!r} is locked by a writer: {who}. Only one process may write a cache_dir, and "
            f"no reader may open it while it is written; cannot {want}. Use another cache_dir or wait for it to exit."
        )

    # -- log ----------------------------------------------------------------

    def _load_log(self) -> None:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            if not self.readonly:
                self._rewrite_log()
            return
        where = str(self.log_path)
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
                f"{where} line 1 is not an insitubatch cache header (want {_header_line().decode().strip()}): "
                f"{lines[0][:200].decode('utf-8', 'replace')!r}"
            )
        if header["version"] != LOG_VERSION:
            self._reset_other_version(header["version"])
            return
        entries: dict[Key, LogEntry] = {}
        files: dict[str, Key] = {}
        for lineno, line in enumerate(lines[1:], start=2):
            entry = LogEntry.from_line(line, f"{where} line {lineno}")
            if files.get(entry.file, entry.key) != entry.key:
                raise CacheCorruptError(
                    f"{where} line {lineno}: file {entry.file!r} is claimed by both "
                    f"{files[entry.file]} and {entry.key}"
                )
            files[entry.file] = entry.key
            if entry.key in entries:
                self._dropped[DROP_SUPERSEDED] += 1
                del entries[entry.key]  # re-insert so the order is that of the latest completion
            entries[entry.key] = entry
        if torn:
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
                f"transforms changed ({detail}). Pass reset_stale_cache=True to delete and rebuild just those "
                "arrays, or use another cache_dir."
            )
        for key in [k for k, e in entries.items() if e.path in stale]:
            self._remove_file(entries.pop(key).file)
            self._dropped[DROP_STALE] += 1
        self._entries = entries
        if self._dropped and not self.readonly:
            self._rewrite_log()
        elif not self.readonly:
            self._open_log()

    def _reset_other_version(self, version: int) -> None:
        """A log of another format version: nothing in it can be read, so every entry is stale."""
        if not self._reset_stale:
            raise StaleCacheError(
                f"{self.log_path} is cache log format version {version}; this insitubatch reads version "
                f"{LOG_VERSION}. Pass reset_stale_cache=True to delete the whole cache and rebuild it, or "
                "use another cache_dir."
            )
        for name in os.listdir(self.cache_dir):
            if _OWNED_SLOT.match(name):
                self._remove_file(name)
        self._dropped[DROP_STALE] += 1
        self._entries = {}
        self._rewrite_log()

    def _rewrite_log(self) -> None:
        """Write the header and every live entry to a temporary file and rename it over the log."""
        if self._log_fd is not None:
            self._close_log_fd()
        body = _header_line() + b"".join(e.to_line() for e in self._entries.values())
        tmp = self.cache_dir / f".{LOG_NAME}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, body)
            os.fsync(fd)  # a rewrite drops lines, so it must not be half there after a crash
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, self.log_path)
        self._open_log()

    def _open_log(self) -> None:
        self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
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
            m = _OWNED_SLOT.match(name)
            if m is None:
                continue
            if m.group(1) == _SPILL_PREFIX or (self.persist and name not in logged):
                self._remove_file(name)

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
        self, path: str, chunk_index: int, tile_shapes: Sequence[Sequence[int]], dtype: object
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
            The slot dtype (after chunk transforms).
        """
        key = (path, operator.index(chunk_index))
        shapes = tuple(tuple(int(x) for x in s) for s in tile_shapes)
        dtype = np.dtype(dtype)
        with self._lock:
            self._check_open()
            held = self._mapped.get(key)
            if held is not None:
                mismatch = _mismatch(held.tile_shapes, held.slot_file.dtype, shapes, dtype)
                return self._views(held) if mismatch is None else self._reject(key, *mismatch)
            if not self.persist:
                return None
            self._fingerprint(path)
            entry = self._entries.get(key)
            if entry is None:
                self._miss_reasons[key] = "no entry in the log"
                return None
            mismatch = _mismatch(entry.tile_shapes, entry.dtype, shapes, dtype)
            if mismatch is not None:
                return self._reject(key, *mismatch)
            try:
                slot_file = open_slot_file(self.cache_dir / entry.file)
            except FileNotFoundError:
                return self._reject(key, REJECT_MISSING, f"its file {entry.file} is missing")
            except CacheCorruptError as exc:
                # a damaged slot file is re-made from the store, not a reason to stop the run
                return self._reject(key, REJECT_FILE, str(exc))
            fits = (
                slot_file.dtype == dtype
                and slot_file.n_tiles == len(shapes)
                and all(len(s) == len(slot_file.tile_shape) and all(a <= b for a, b in zip(s, slot_file.tile_shape))
                        for s in shapes)
            )
            if not fits:
                slot_file.close()
                return self._reject(
                    key, REJECT_FILE,
                    f"its file {entry.file} holds {slot_file.n_tiles} tiles of "
                    f"{slot_file.tile_shape} {slot_file.dtype}",
                )
            held = self._mapped[key] = _Mapped(slot_file, shapes)
            self._revived += 1
            self._miss_reasons.pop(key, None)
            return self._views(held)

    def _reject(self, key: Key, reason: str, detail: str) -> None:
        self._rejected[reason] += 1
        self._miss_reasons[key] = detail
        return None

    @staticmethod
    def _views(held: _Mapped) -> list[np.ndarray]:
        return [tile_view(held.slot_file, i, s) for i, s in enumerate(held.tile_shapes)]

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
        self, path: str, chunk_index: int, n_tiles: int, stored_tile_shape: Sequence[int], dtype: object
    ) -> WriteHandle:
        """Start writing a chunk: a slot file of ``n_tiles`` × ``stored_tile_shape`` under a temporary name.

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
            target = self.cache_dir / slot_basename(path, key[1], persist=self.persist)
            handle = WriteHandle(key, create_slot_file(target, n_tiles, stored_tile_shape, dtype, temp=True))
            self._pending[key] = handle
            return handle

    def write(self, handle: WriteHandle, tile_index: int, tile: np.ndarray) -> np.ndarray:
        """Copy one decoded tile into its slot (GIL released); returns the writable view of it."""
        if handle.done:
            path, chunk = handle.key
            raise ValueError(f"the write of array {path!r} chunk {chunk} was already committed or aborted")
        view = write_tile(handle.slot_file, tile_index, tile)
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
            When a tile was never written or ``tile_shapes`` does not fit the slot.
        """
        shapes = tuple(tuple(int(x) for x in s) for s in tile_shapes)
        sf = handle.slot_file
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
            readable = open_slot_file(final)
            old = self._mapped.pop(handle.key, None)
            if old is not None:
                old.slot_file.close()
            held = self._mapped[handle.key] = _Mapped(readable, shapes)
            self._written += 1
            self._miss_reasons.pop(handle.key, None)
            if self.persist:
                entry = LogEntry(path, chunk, final.name, shapes, sf.dtype, self.fingerprints[path])
                if self._entries.get(handle.key) != entry:
                    assert self._log_fd is not None
                    _write_all(self._log_fd, entry.to_line())
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
                handle.slot_file.close()

    def evict(self, path: str, chunk_index: int) -> None:
        """Release a chunk's mapping; an ephemeral chunk's file is deleted, a persisted one stays.

        A no-op for a chunk the cache does not hold mapped.
        """
        key = (path, operator.index(chunk_index))
        with self._lock:
            held = self._mapped.pop(key, None)
            if held is None:
                return
            held.slot_file.close()
            if not self.persist:
                held.slot_file.path.unlink(missing_ok=True)
                self._spilled.discard(held.slot_file.path)

    # -- observability ------------------------------------------------------

    @property
    def mapped_bytes(self) -> int:
        """Slot bytes this cache holds mapped now (held chunks and writes in progress)."""
        with self._lock:
            held = sum(m.nbytes for m in self._mapped.values())
            return held + sum(h.slot_file.n_tiles * h.slot_file.slot_bytes for h in self._pending.values())

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
                held.slot_file.close()
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


def _mismatch(
    have_shapes: tuple[tuple[int, ...], ...],
    have_dtype: np.dtype,
    shapes: tuple[tuple[int, ...], ...],
    dtype: np.dtype,
) -> tuple[str, str] | None:
    """``(reason, detail)`` when a cached chunk's tiles are not the ones asked for, else ``None``."""
    if have_shapes != shapes:
        return REJECT_SHAPE, f"its cached tile shapes {have_shapes} differ from the requested {shapes}"
    if have_dtype != dtype:
        return REJECT_DTYPE, f"its cached dtype {have_dtype} differs from the requested {dtype}"
    return None


def _write_all(fd: int, data: bytes) -> None:
    """``write`` until every byte is out (a regular file takes it in one call unless the disk fills)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
