"""Whether a ``DiskCache`` still writes: a full disk stops it for good, and the chunks it did not write, by reason.

``ENOSPC``/``EDQUOT`` anywhere a cache writes (a tile file, a claim, a log
line, its segment, a compaction) stops that cache writing for its life, with
one WARNING naming the directory, the bytes and the free space; the pass
goes on with what is already there. ``refused`` counts the chunks ``begin``
did not write: ``full`` (the disk), ``budget`` (``disk_bytes``), ``busy``
(another writer's claim).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections import Counter
from pathlib import Path

__all__ = ["FULL_ERRNOS", "DiskSpace"]

logger = logging.getLogger("insitubatch")

# The errors that mean "no room": the disk is full, or the user's quota is spent.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskSpace:
    """The writing state of one cache over ``cache_dir``; the caller holds the cache's lock.

    Parameters
    ----------
    cache_dir
        The directory, named in the WARNING.
    persist
        What stopping means for the user: no more persisting (``True``) or
        no more spilling (``False``).
    writes
        Whether the cache writes at all (``False`` for a readonly reader).
    """

    def __init__(self, cache_dir: Path, *, persist: bool, writes: bool) -> None:
        self.cache_dir = cache_dir
        self.persist = persist
        self.persisting = writes  # False once a full disk stopped this cache writing (or it never writes)
        self.over_budget = False  # a chunk was not written because it would have passed disk_bytes
        self.refused: Counter[str] = Counter()
        self._full_warned = False

    def refuse(self, reason: str) -> None:
        """Count one chunk ``begin`` did not write, for ``reason`` (``full``, ``budget``, ``busy``)."""
        self.refused[reason] += 1
        if reason == "budget":
            self.over_budget = True

    def stop(self, exc: OSError, nbytes: int) -> None:
        """The disk is full: stop writing for this cache's life, with one WARNING."""
        self.persisting = False
        self.refused["full"] += 1
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
