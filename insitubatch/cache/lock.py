"""The cache directory's lock: one writer or many readonly readers, and the network filesystems where it cannot hold.

``insitu_cache.lock`` is the advisory ``flock`` target, held for the cache's
lifetime: exclusive for a writer (which records its PID and host in the file),
shared for a ``readonly`` reader. It is never deleted: deleting it would make
the next two processes lock different inodes. The kernel drops the lock when
its holder dies, SIGKILL included, so there is no stale lock to clean up. The
fd is close-on-exec, but a *forked* child shares the lock until it exits.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from ..errors import CacheLockedError

__all__ = ["LOCK_NAME", "acquire_lock", "network_filesystem"]

LOCK_NAME = "insitu_cache.lock"
_MOUNTS = Path("/proc/mounts")
# Filesystems where flock is per client (or emulated), so two hosts can both "hold" it.
_NETWORK_FS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "afs", "gpfs", "beegfs", "fuse"}
)
_NETWORK_FS_PREFIXES = ("fuse.",)
# Bytes of the lock file read back to name its holder: a one-line JSON record fits many times over.
_HOLDER_READ_BYTES = 4096


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


def acquire_lock(cache_dir: Path, fds: list[int], *, readonly: bool) -> None:
    """Take ``cache_dir``'s lock without blocking: shared for a reader, exclusive (and signed) for a writer.

    The lock file's descriptor is appended to ``fds`` before the lock is tried,
    so the caller's cleanup closes it on every path.

    Raises
    ------
    CacheLockedError
        When another process holds the lock in a conflicting mode; the message names it.
    """
    lock_path = cache_dir / LOCK_NAME
    flags = os.O_CLOEXEC | (os.O_RDONLY if readonly else os.O_RDWR)
    try:
        fd = os.open(lock_path, flags)
    except FileNotFoundError:
        # the one file a readonly cache may create: without it, no writer could be excluded
        fd = os.open(lock_path, flags | os.O_CREAT, 0o644)
    fds.append(fd)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise
        raise CacheLockedError(exc.errno, _holder_message(cache_dir, fd, readonly=readonly)) from None
    if not readonly:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        data = (json.dumps(record) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


def _holder_message(cache_dir: Path, fd: int, *, readonly: bool) -> str:
    """Who holds the lock: a writer (from the lock file) or readonly readers."""
    where = str(cache_dir)
    if not readonly:
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
        holder = json.loads(os.pread(fd, _HOLDER_READ_BYTES, 0))
        who = f"PID {holder['pid']} on host {holder['host']} (since {holder.get('since', '?')})"
    except (OSError, ValueError, KeyError, TypeError):
        who = "a process that has not recorded its PID and host yet"
    want = "read it" if readonly else "write it"
    return (
        f"cache_dir {where!r} is locked by a writer: {who}. Only one process may write a cache_dir, and "
        f"no reader may open it while it is written; cannot {want}. Use another cache_dir or wait for it to exit."
    )
