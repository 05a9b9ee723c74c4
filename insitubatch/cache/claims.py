"""Write claims: a persisted chunk is made by one writer at a time, across processes.

A claim is the exclusive ``flock`` of ``insitu_cache.d/<tile file stem>.claim``.
Taking one opens (creating) the file, locks it without blocking, and checks
that the name still leads to the locked inode: a holder releases by
unlinking the name *while it still holds the lock*, so a lock won on an
inode that has lost its name is worthless and the taker tries again. A
holder that dies leaves its file unlocked, and the next taker simply wins
it: there is nothing stale to clean up.

The holder publishes the chunk's file and appends its log line before it
releases, so whoever takes the claim next and then re-reads the logs finds
the chunk if it was finished, and revives it instead of fetching it again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .lock import try_lock

__all__ = ["Claims"]

# Tries before a claim that keeps changing hands under us counts as taken by another writer.
_TAKE_TRIES = 8


class Claims:
    """The claims one writer holds in ``shared_dir``; its descriptors are listed in ``fds`` (closed on collection).

    Thread-safe; the file work runs outside its lock. Two threads of one
    writer racing for one claim see each other as another writer (the loser
    is told it is taken), which the engine never does: it fetches a chunk
    once per process.
    """

    def __init__(self, shared_dir: Path, fds: list[int]) -> None:
        self.shared_dir = shared_dir
        self._fds = fds
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def holds(self, name: str) -> bool:
        with self._lock:
            return name in self._held

    def take(self, name: str) -> bool:
        """Claim ``name``: True when this writer holds it now (or already did), False while another does.

        Raises
        ------
        OSError
            When the claim file cannot be created (a full disk: ``ENOSPC``).
        """
        if self.holds(name):
            return True
        path = self.shared_dir / name
        for _ in range(_TAKE_TRIES):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if not try_lock(fd, shared=False):
                    os.close(fd)
                    return False
                try:
                    st = os.stat(path)
                except FileNotFoundError:  # released (unlinked) between our open and our lock
                    same = False
                else:
                    mine = os.fstat(fd)
                    same = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
            except BaseException:
                os.close(fd)
                raise
            if same:
                with self._lock:
                    self._held[name] = fd
                    self._fds.append(fd)
                return True
            os.close(fd)
        return False

    def release(self, name: str) -> None:
        """Let another writer make the chunk. A no-op for a claim not held."""
        with self._lock:
            fd = self._held.pop(name, None)
        if fd is None:
            return
        try:
            (self.shared_dir / name).unlink(missing_ok=True)  # while still locked: see the module docstring
        finally:
            with self._lock:
                self._fds.remove(fd)
            os.close(fd)

    def release_all(self) -> None:
        with self._lock:
            names = list(self._held)
        for name in names:
            self.release(name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
