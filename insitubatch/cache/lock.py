"""Who may open a cache directory: writers together, or readonly readers together, never both.

Everything rests on advisory ``flock`` locks, which the kernel drops when
their holder dies (``SIGKILL`` included), so no lock is ever stale:

* ``insitu_cache.lock`` is the *gate*. A writer holds it exclusively only
  while it is being admitted (it checks for readers, tidies up what dead
  writers left, registers itself); a readonly reader holds it shared for its
  whole life. So readers keep writers out, and the other way round, while
  any number of either coexist.
* each writer registers by creating its log segment
  ``insitu_cache.d/<writer>.jsonl`` (``ledger``) and holding an exclusive
  ``flock`` on it until it closes. The segment's first line names its PID and
  host, written before the gate is released, so whoever finds the writer
  can name it. A segment whose lock can be taken belongs to a dead writer.

A writer blocked by readers names them from the kernel's lock table
(``/proc/locks``); a reader blocked by writers names them from their
segments; an opener kept waiting past ``GATE_WAIT_S`` by another's admission
names it from the record the gate holder wrote into the lock file. Every
opener checks, once it holds the gate, that the lock file it locked is still
the one at ``insitu_cache.lock`` (:func:`open_gate`), and starts again if
not: so the last spill writer out of a directory no persisted cache lives in
may delete the lock file (and the directory, if it made it) under the gate
(:func:`leave_directory`), and the next two openers still lock one inode. Descriptors are close-on-exec, but a
*forked* child shares its parent's locks until it exits.

Without ``fcntl`` (not a POSIX platform) there is no ``flock``:
``require_flock`` refuses a ``cache_dir`` with ``CachePlatformError``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from ..errors import CacheLockedError, CachePlatformError

_fcntl: ModuleType | None
try:
    import fcntl as _fcntl
except ImportError:  # not a POSIX platform: a cache_dir is refused (require_flock)
    _fcntl = None

__all__ = [
    "GATE_WAIT_S",
    "LOCK_NAME",
    "HolderRecord",
    "describe_holder",
    "leave_directory",
    "network_filesystem",
    "open_gate",
    "probe",
    "require_flock",
    "try_lock",
    "unlock",
]

LOCK_NAME = "insitu_cache.lock"
# How long an opener waits while another is admitted (or compacts, or resets stale arrays)
# before it names that process and gives up: a reset deletes files, which can take seconds.
GATE_WAIT_S = 30.0
# Pause between two tries of a contended gate: admissions take well under a millisecond or two.
GATE_POLL_S = 0.002
# A writer that finds readers looks again for this long before naming them: a reader that is
# itself losing to a live writer lets go of the gate within microseconds.
READERS_SETTLE_S = 0.05
_MOUNTS = Path("/proc/mounts")
_LOCKS = Path("/proc/locks")
# Filesystems where flock is per client (or emulated), so two hosts can both "hold" it.
_NETWORK_FS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "afs", "gpfs", "beegfs", "fuse"}
)
_NETWORK_FS_PREFIXES = ("fuse.",)
# Bytes of the lock file read back to name the gate's holder: a one-line JSON record fits many times over.
_HOLDER_READ_BYTES = 4096

HolderRecord = Mapping[str, object]


def require_flock(cache_dir: Path) -> None:
    """Refuse ``cache_dir`` on a platform without ``flock``.

    Raises
    ------
    CachePlatformError
        Naming the platform.
    """
    if _fcntl is None:
        raise CachePlatformError(
            errno.ENOSYS,
            f"cache_dir={str(cache_dir)!r} needs POSIX advisory file locks (fcntl.flock) to keep its writers and "
            f"readers apart, and this platform ({sys.platform}) has none; iterate without cache_dir (the pool "
            "then holds chunks in memory) or run on Linux",
        )


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


# -- flock primitives ---------------------------------------------------------


def try_lock(fd: int, *, shared: bool) -> bool:
    """Take ``fd``'s ``flock`` without blocking; False when another holder conflicts."""
    assert _fcntl is not None  # require_flock ran before any cache opened a file
    try:
        _fcntl.flock(fd, (_fcntl.LOCK_SH if shared else _fcntl.LOCK_EX) | _fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def unlock(fd: int) -> None:
    assert _fcntl is not None
    _fcntl.flock(fd, _fcntl.LOCK_UN)


def probe(path: Path) -> bool | None:
    """Whether the exclusive holder of ``path``'s lock is alive: True, False (dead), None (no such file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return not try_lock(fd, shared=True)
    finally:
        os.close(fd)  # drops the probe's lock, if it took one


def holder_record(writer: str) -> dict[str, object]:
    """What a writer says about itself: its token, PID, host and start time."""
    return {
        "writer": writer,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def describe_holder(record: HolderRecord | None) -> str:
    """``PID 123 on host h (since ...)``, or what is known when the record is missing."""
    if not record or "pid" not in record:
        return "a process whose record could not be read"
    return f"PID {record['pid']} on host {record.get('host', '?')} (since {record.get('since', '?')})"


# -- the gate -----------------------------------------------------------------


def take_gate(cache_dir: Path, fd: int, *, shared: bool) -> None:
    """Hold the gate: exclusive for a writer's admission, shared for a reader's lifetime.

    Waits up to ``GATE_WAIT_S`` for another writer's admission; a writer
    that meets readers fails at once.

    Raises
    ------
    CacheLockedError
        Readers hold the gate (for a writer), or another's admission outlasted the wait; names them.
    """
    deadline = time.monotonic() + GATE_WAIT_S
    settle: float | None = None
    while not try_lock(fd, shared=shared):
        if not shared:
            readers = _readers(fd)
            if readers is None or readers:  # make sure they stay: a reader losing to a live writer leaves at once
                settle = time.monotonic() + READERS_SETTLE_S if settle is None else settle
                if time.monotonic() >= settle:
                    raise CacheLockedError(errno.EAGAIN, _readers_message(cache_dir, readers))
            else:
                settle = None
        if time.monotonic() >= deadline:
            raise CacheLockedError(errno.EAGAIN, _gate_message(cache_dir, fd))
        time.sleep(GATE_POLL_S)


def open_gate(cache_dir: Path, *, shared: bool, writable: bool) -> int:
    """Open ``cache_dir``'s lock file (made, with the directory, if missing) and hold the gate; its descriptor.

    Locked, the descriptor must still be the file at its path: one a last
    spill writer deleted under the gate (``leave_directory``) is let go and
    the directory and file made anew. Raises as :func:`take_gate` does.
    """
    path = cache_dir / LOCK_NAME
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CREAT | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:  # the directory went with the last spill writer: make it again
            cache_dir.mkdir(parents=True, exist_ok=True)
            continue
        try:
            take_gate(cache_dir, fd, shared=shared)
            if _is_the_gate(path, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _is_the_gate(path: Path, fd: int) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def leave_directory(cache_dir: Path, shared_dir: Path, log: Path, *, made_dir: bool) -> None:
    """A spill writer's last step: remove ``shared_dir`` if no writer uses it, then the lock file unless a
    persisted cache lives here (its ``log``), and ``cache_dir`` if this writer made it and it is empty.
    Only with the gate free (no one being admitted, no reader); anything in use stays, silently."""
    path = cache_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not try_lock(fd, shared=False) or not _is_the_gate(path, fd):
            return
        try:
            shared_dir.rmdir()  # fails while another writer's segment (or anything) is in it
        except FileNotFoundError:
            pass
        except OSError:
            return
        if not log.exists():
            os.unlink(path)  # openers waiting on this inode see it gone and start again (open_gate)
        if made_dir:
            try:
                cache_dir.rmdir()
            except OSError:  # something else is in it, or arrived meanwhile: it stays
                pass
    finally:
        os.close(fd)


def sign_gate(fd: int, record: HolderRecord) -> None:
    """Write the admitted writer's record into the lock file (named if another opener waits too long)."""
    data = (json.dumps(record) + "\n").encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as exc:  # a full disk: only a long wait's message loses the name
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise


def _readers(fd: int) -> list[int] | None:
    """PIDs holding ``fd``'s file shared (readonly readers); [] when none; None when unknowable here.

    Reads the kernel's lock table, which lists each ``flock`` with its PID and
    the file's device and inode. Without one (not Linux), shared holders are
    detected by taking the lock shared: the PIDs then stay unknown.
    """
    st = os.fstat(fd)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        table = _LOCKS.read_text()
    except OSError:
        if try_lock(fd, shared=True):
            unlock(fd)
            return None  # shared holders, or none left: either way not an admission in progress
        return []
    pids = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK" or fields[3] != "READ":
            continue
        major, minor, ino = fields[5].split(":")
        if (int(major, 16), int(minor, 16), int(ino)) == want:
            pids.append(int(fields[4]))
    return sorted(set(pids))


def _readers_message(cache_dir: Path, pids: list[int] | None) -> str:
    host = socket.gethostname()
    who = (
        ", ".join(f"PID {p} on host {host}" for p in pids)
        if pids
        else "processes this platform cannot list (no /proc/locks)"
    )
    return (
        f"cache_dir {str(cache_dir)!r} is open by readonly readers (readonly_cache=True): {who}. Readers exclude "
        "writers (they rely on a cache nobody changes); wait for them to finish or write to another cache_dir"
    )


def _gate_message(cache_dir: Path, fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, _HOLDER_READ_BYTES, 0))
    except (OSError, ValueError):
        record = None
    return (
        f"cache_dir {str(cache_dir)!r} has been held for more than {GATE_WAIT_S:.0f} s by "
        f"{describe_holder(record if isinstance(record, dict) else None)}, which is opening it as a writer "
        "(tidying up after dead writers, compacting the log or resetting stale arrays); wait for it or use "
        "another cache_dir"
    )


def writers_message(cache_dir: Path, writers: Mapping[str, HolderRecord | None], *, wanted: str) -> str:
    """The error text when live writers keep this opener from ``wanted``."""
    who = ", ".join(describe_holder(r) for r in writers.values())
    return (
        f"cache_dir {str(cache_dir)!r} is being written by {len(writers)} live writer(s): {who}; cannot {wanted}. "
        "Wait for them to finish or use another cache_dir."
    )


def release_fds(fds: list[int]) -> None:
    """Close the cache's descriptors (their locks go with them); run by ``close`` or at collection."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass
