"""``CacheReader``: a ``DiskCache``'s reading side: ``find``/``lookup`` revive a logged chunk, verify it, or claim a miss.

The reader holds the cache's index (what is logged), its held chunks (what
is mapped), its claims and its disk space; it keeps what it learnt about
files: which it verified, which it turned away and why a chunk missed. The
writer tells it of each chunk it commits (``committed``).

A chunk is looked up in this process's view of every writer's log lines;
one not there is looked for again in what the others appended since (at
most every ``REFRESH_S`` on plain misses, and always once a claim is won,
since the last holder of a claim logged its chunk before letting go). A
logged file is mapped, its size checked against its line, and its CRC-32C
verified the first time this process maps that file (name, inode, size,
mtime). A damaged file (checksum, size, header) is a miss, re-made from the
store with one WARNING per file, or ``CacheCorruptError`` under
``on_corrupt="raise"``; a missing one is a plain miss.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import CacheCorruptError, CacheMissError
from .claims import Claims
from .files import (
    REJECT_CHECKSUM,
    REJECT_DTYPE,
    REJECT_FILE,
    REJECT_MISSING,
    REJECT_SHAPE,
    claim_name,
    persisted_basename,
)
from .held import HeldChunks
from .index import CacheIndex
from .log import Key, LogEntry
from .options import CacheOptions
from .space import FULL_ERRNOS, DiskSpace
from .tilefile import TileFile, open_tile_file, open_tile_files

__all__ = ["REFRESH_S", "CacheReader", "Found", "Premapped"]

logger = logging.getLogger("insitubatch")

# Seconds between two reads of the other writers' logs on plain misses; a won claim always reads them.
REFRESH_S = 0.05


@dataclass(frozen=True)
class Found:
    """What ``DiskCache.find`` found for a chunk.

    ``tiles``: its read-only views, or ``None`` on a miss. ``from_other``:
    revived from a file another writer made. ``claimed``: a miss this writer
    now owns — fetch it and ``begin``/``commit`` it, or ``release`` it.
    ``busy``: a miss another live writer is making — look again later.
    """

    tiles: list[np.ndarray] | None = None
    from_other: bool = False
    claimed: bool = False
    busy: bool = False


_MISS, _BUSY, _CLAIMED = Found(), Found(busy=True), Found(claimed=True)

# what premap mapped: file name -> (the log line it was mapped for, its TileFile or why it could not be)
Premapped = dict[str, tuple[LogEntry, "TileFile | Exception"]]


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


class CacheReader:
    """``find``, ``lookup``, ``premap`` and ``miss_error`` of a ``DiskCache``, and what it learnt about files.

    Parameters
    ----------
    options
        The cache's options (``persist``, ``readonly``, ``on_corrupt``).
    index, held, claims, space
        The cache's logged entries, mapped chunks, write claims and writing state.
    lock
        The cache's lock, held around every touch of the parts above.
    """

    def __init__(
        self,
        options: CacheOptions,
        *,
        index: CacheIndex,
        held: HeldChunks,
        claims: Claims,
        space: DiskSpace,
        lock: threading.RLock,
    ) -> None:
        self.options = options
        self.cache_dir = index.cache_dir
        self.verify = True  # check each file's CRC-32C when first revived (the bench turns it off to measure it)
        self._index = index
        self._held = held
        self._claims = claims
        self._space = space
        self._lock = lock
        self._miss_reasons: dict[Key, str] = {}
        # entries turned away, for any request (a damaged file: None) or for one (shapes, dtype): not tried again
        self._bad: dict[Key, tuple[LogEntry, tuple | None]] = {}
        self._verified_files: dict[str, tuple[tuple[int, int, int], int]] = {}  # file name -> (identity, CRC) checked
        self._warned_files: set[str] = set()
        self.revived = 0  # chunks mapped back from a persisted file
        self.revived_from_others = 0  # the part of revived whose file another writer made
        self._rejected: Counter[str] = Counter()

    @property
    def rejected(self) -> dict[str, int]:
        """Logged entries ``lookup`` turned away, by reason (``shape``, ``dtype``, ``missing``, ``file``, ``checksum``)."""
        with self._lock:
            return dict(self._rejected)

    def committed(self, key: Key, *, verified: tuple[str, tuple[int, int, int], int] | None) -> None:
        """The writer published the chunk ``key``: forget why it missed and, for a logged file, that it was turned away.

        ``verified``: ``(file name, identity, CRC-32C)`` of a persisted file the
        writer checksummed itself, so its first revive needs no checksum.
        Called with the lock held.
        """
        self._miss_reasons.pop(key, None)
        if verified is not None:
            name, identity, crc = verified
            self._verified_files[name] = (identity, crc)
            self._bad.pop(key, None)

    def premap(self, keys: Sequence[tuple[str, int]]) -> Premapped:
        """Map the logged files of many chunks in one kernel call, checksummed where not verified yet.

        ``find(..., premapped=)`` takes a chunk's file from the result rather
        than mapping it alone, so a block's revival costs one GIL hand-off and
        its checksums run while other threads hold the GIL; ``close_premapped``
        unmaps what no ``find`` took.
        """
        wanted: dict[str, tuple[LogEntry, bool]] = {}
        with self._lock:
            if not self.options.persist or self._held.closed:
                return {}
            for path, chunk_index in keys:
                key = (path, operator.index(chunk_index))
                entry = self._index.entry(key)
                if entry is not None and self._held.get(key) is None and entry.file not in wanted:
                    wanted[entry.file] = (entry, self.verify and entry.file not in self._verified_files)
        files = open_tile_files([self.cache_dir / name for name in wanted], [v for _, v in wanted.values()])
        return {name: (entry, f) for (name, (entry, _)), f in zip(wanted.items(), files)}

    @staticmethod
    def close_premapped(premapped: Premapped) -> None:
        """Unmap the files ``premap`` mapped that no ``find`` took."""
        for _, f in premapped.values():
            if isinstance(f, TileFile):
                f.close()
        premapped.clear()

    def lookup(
        self, path: str, chunk_index: int, tile_shapes: Sequence[Sequence[int]], dtype: npt.DTypeLike
    ) -> list[np.ndarray] | None:
        """The chunk's tiles as read-only zero-copy views, or ``None`` on a miss (``find`` without claiming)."""
        return self.find(path, chunk_index, tile_shapes, dtype, claim=False).tiles

    def find(
        self,
        path: str,
        chunk_index: int,
        tile_shapes: Sequence[Sequence[int]],
        dtype: npt.DTypeLike,
        *,
        claim: bool = True,
        premapped: Premapped | None = None,
    ) -> Found:
        """Revive the chunk if any writer logged it; else, with ``claim``, claim it for this writer.

        A logged entry is revived (mapped, its checksum verified on first
        touch) when its tile shapes and dtype equal ``tile_shapes`` and
        ``dtype``; otherwise it is a miss, counted in ``rejected``, and the
        next ``commit`` of the chunk overwrites it. A chunk this cache holds
        mapped is returned again.

        Parameters
        ----------
        path, chunk_index
            The array's (opaque) name and global sample-axis chunk index.
        tile_shapes
            Each tile's real shape, ``(chunk_len, *tile_extent)``.
        dtype
            The tiles' dtype (after chunk transforms).
        claim
            On a miss of a writing persisted cache, claim the chunk
            (``Found.claimed``), or report it ``busy`` when another live writer
            holds its claim.
        premapped
            What ``premap`` mapped for a batch of lookups this one belongs to.

        Raises
        ------
        CacheCorruptError
            A damaged file under ``on_corrupt="raise"``.
        """
        key = (path, operator.index(chunk_index))
        shapes = tuple(tuple(int(x) for x in s) for s in tile_shapes)
        dt = np.dtype(dtype)
        found = self._revive(key, shapes, dt, premapped)
        options = self.options
        if found is not None or not claim or options.readonly or not options.persist or not self._space.persisting:
            return found or _MISS
        name = claim_name(persisted_basename(path, key[1], self._index.fingerprint(path)))
        try:
            if not self._claims.take(name):  # file work: not under the cache's lock
                return _BUSY
        except OSError as exc:
            if exc.errno not in FULL_ERRNOS:
                raise
            with self._lock:
                self._space.stop(exc, 0)
            return _MISS
        with self._lock:
            if self._held.closed:
                self._claims.release(name)
                self._held.check_open()
            self._index.refresh()  # a writer that held it logged it before letting go
        found = self._revive(key, shapes, dt, premapped)
        if found is not None:
            with self._lock:
                self._claims.release(name)
            return found
        return _CLAIMED

    def _revive(
        self, key: Key, shapes: tuple[tuple[int, ...], ...], dt: np.dtype, premapped: Premapped | None = None
    ) -> Found | None:
        """The chunk held or revived from its logged file; None when it cannot be."""
        path = key[0]
        with self._lock:
            self._held.check_open()
            held = self._held.get(key)
            if held is not None:
                mismatch = _mismatch(held.tile_shapes, held.tile_file.dtype, shapes, dt)
                if mismatch is None:
                    return Found(held.views())
                self._reject(key, *mismatch)
                return None
            if not self.options.persist:
                return None
            self._index.fingerprint(path)
            entry = self._index.entry(key)
            if entry is None:
                self._index.refresh(every=REFRESH_S)
                entry = self._index.entry(key)
            if entry is None:
                self._miss_reasons[key] = "no entry in the log"
                return None
            bad = self._bad.get(key)
            if bad is not None and bad[0] is entry and bad[1] in (None, (shapes, dt)):
                return None  # turned away already (a newer line of the chunk is tried)
            mismatch = _mismatch(entry.tile_shapes, entry.dtype, shapes, dt)
            if mismatch is not None:
                self._bad[key] = (entry, (shapes, dt))
                self._reject(key, *mismatch)
                return None
        # file I/O and the checksum: not under the lock
        tile_file, problem = self._open_entry(entry, shapes, dt, premapped)
        with self._lock:
            if tile_file is None:
                self._reject(key, *problem)
                if problem[0] != REJECT_MISSING:
                    self._damaged(key, entry, problem[1])  # raises under on_corrupt="raise", every time
                self._bad[key] = (entry, None)
                return None
            held = self._held.get(key)
            if held is not None or self._held.closed:  # another thread revived it meanwhile (or we closed)
                tile_file.close()
                self._held.check_open()
                return Found(held.views()) if held is not None else None
            held = self._held.hold(key, tile_file, shapes, spill=False)
            self.revived += 1
            from_other = not self._index.made_here(entry)
            self.revived_from_others += from_other
            self._miss_reasons.pop(key, None)
            return Found(held.views(), from_other=from_other)

    def _open_entry(
        self, entry: LogEntry, shapes: tuple[tuple[int, ...], ...], dt: np.dtype, premapped: Premapped | None
    ) -> tuple[TileFile | None, tuple[str, str]]:
        """Map an entry's file and check it against its line: ``(file, _)`` or ``(None, (reason, detail))``."""
        # checksummed in the same call that maps it, unless this process verified this very file before
        known = self._verified_files.get(entry.file) if self.verify else None
        seen, opened = premapped.pop(entry.file, (None, None)) if premapped else (None, None)
        if seen is not entry and isinstance(opened, TileFile):  # mapped for an older line of the chunk
            opened.close()
        try:
            if seen is not entry:
                opened = open_tile_file(self.cache_dir / entry.file, checksum=self.verify and known is None)
            elif isinstance(opened, Exception):
                raise opened
            assert isinstance(opened, TileFile)
            tile_file = opened
        except FileNotFoundError:
            return None, (REJECT_MISSING, f"its file {entry.file} is missing")
        except CacheCorruptError as exc:
            return None, (REJECT_FILE, str(exc))
        problem = None
        fits = (
            tile_file.dtype == dt
            and tile_file.n_tiles == len(shapes)
            and all(
                len(s) == len(tile_file.tile_shape) and all(a <= b for a, b in zip(s, tile_file.tile_shape))
                for s in shapes
            )
        )
        if not fits:
            problem = (
                REJECT_FILE,
                f"it holds {tile_file.n_tiles} tiles of {tile_file.tile_shape} {tile_file.dtype}",
            )
        elif tile_file.nbytes != entry.nbytes:
            problem = (REJECT_FILE, f"it is {tile_file.nbytes} bytes, its log line says {entry.nbytes}")
        elif self.verify and known != (tile_file.identity, entry.crc32c):
            crc = tile_file.crc_at_open
            if crc is None:  # verified before as another file under this name: not this one
                crc = tile_file.checksum()
            if crc != entry.crc32c:
                problem = (REJECT_CHECKSUM, f"its CRC-32C is {crc:#010x}, its log line says {entry.crc32c:#010x}")
            else:
                with self._lock:
                    self._verified_files[entry.file] = (tile_file.identity, entry.crc32c)
        if problem is not None:
            tile_file.close()
            return None, problem
        return tile_file, ("", "")

    def _damaged(self, key: Key, entry: LogEntry, why: str) -> None:
        """A damaged tile file: raise under ``on_corrupt="raise"``, else one WARNING per file (lock held)."""
        where = self.cache_dir / entry.file
        if self.options.on_corrupt == "raise":
            raise CacheCorruptError(
                f"cache tile file {where} (array {key[0]!r} chunk {key[1]}) is damaged: {why}. Delete it (or the "
                "cache_dir) to rebuild it, or pass on_corrupt_cache='refetch' to re-fetch damaged chunks"
            )
        if entry.file not in self._warned_files:
            self._warned_files.add(entry.file)
            logger.warning(
                "insitubatch: cache tile file %s (array %r chunk %d) is damaged: %s; %s",
                where,
                key[0],
                key[1],
                why,
                "a readonly cache cannot re-make it" if self.options.readonly else "re-fetching it from the store",
            )

    def _reject(self, key: Key, reason: str, detail: str) -> None:
        self._rejected[reason] += 1
        self._miss_reasons[key] = detail

    def miss_error(self, path: str, chunk_index: int) -> CacheMissError:
        """The error a readonly pass raises for a chunk ``lookup`` could not serve."""
        key = (path, operator.index(chunk_index))
        why = self._miss_reasons.get(key, "no entry in the log")
        return CacheMissError(
            f"readonly cache_dir {str(self.cache_dir)!r} cannot serve array {path!r} chunk {key[1]}: {why}. "
            "A readonly cache must already hold every chunk the pass reads; warm it with a writing run "
            "over the same split and transforms."
        )
