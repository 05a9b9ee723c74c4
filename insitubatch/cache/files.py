"""Tile file names, and the small records ``DiskCache`` keeps per chunk.

Names are deterministic (``cache-…`` persisted, ``spill-…`` ephemeral, with
a hash of the array path) so a later run finds a persisted chunk by name, and
the ``_OWNED_*`` patterns let housekeeping delete only files this package wrote.

Files in ``cache_dir``
----------------------
``insitu_cache.lock``
    The ``flock`` target (``lock``): one writer or many readonly readers.
``insitu_cache.jsonl``
    The log (``persist`` only; format in ``log``).
``cache-<hash>-<chunk>-<slug>.npy`` / ``spill-…npy``
    Tile files of persisted / ephemeral chunks. Ephemeral files have their own
    names, so a spill run never clobbers a persisted entry.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

import numpy as np

from .log import LOG_NAME, Key
from .tilefile import TileFile

__all__ = [
    "DROP_STALE",
    "DROP_SUPERSEDED",
    "DROP_TORN",
    "REJECT_DTYPE",
    "REJECT_FILE",
    "REJECT_MISSING",
    "REJECT_SHAPE",
    "WriteHandle",
    "tile_file_basename",
]

_PERSIST_PREFIX, _SPILL_PREFIX = "cache", "spill"
# Bytes of the array path's hash in a tile file name (8 hex digits; the slug keeps names readable).
_NAME_HASH_BYTES = 4
# Longest array-path slug in a tile file name, well inside NAME_MAX (255).
_SLUG_MAX = 64
_OWNED_TILE_FILE = re.compile(rf"^({_PERSIST_PREFIX}|{_SPILL_PREFIX})-[0-9a-f]{{8}}-\d+-[A-Za-z0-9_.-]+\.npy$")
# create_tile_file(temp=True) and our compaction write ".<name>.<pid>-<hex>.tmp" next to the target.
_OWNED_TEMP = re.compile(
    rf"^\.(({_PERSIST_PREFIX}|{_SPILL_PREFIX})-.*\.npy|{re.escape(LOG_NAME)})\.\d+-[0-9a-f]+\.tmp$"
)
# Reasons ``lookup`` turns a logged entry away (``rejected``) and a load drops one (``dropped``).
REJECT_SHAPE, REJECT_DTYPE, REJECT_MISSING, REJECT_FILE = "shape", "dtype", "missing", "file"
DROP_STALE, DROP_SUPERSEDED, DROP_TORN = "stale", "superseded", "torn"


def tile_file_basename(path: str, chunk_index: int, *, persist: bool) -> str:
    """The tile file name of ``(path, chunk_index)``: deterministic, a bare basename.

    ``cache-…`` for persisted chunks, ``spill-…`` for ephemeral ones. The array
    path's hash keeps two paths with the same slug apart.
    """
    digest = hashlib.blake2b(path.encode(), digest_size=_NAME_HASH_BYTES).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", path).strip("._")[:_SLUG_MAX] or "array"
    return f"{_PERSIST_PREFIX if persist else _SPILL_PREFIX}-{digest}-{int(chunk_index)}-{slug}.npy"


@dataclass(eq=False)
class WriteHandle:
    """A chunk being written by ``DiskCache.begin``: its tile file under a temporary name."""

    key: Key
    tile_file: TileFile
    written: set[int] = field(default_factory=set)
    done: bool = False


@dataclass(eq=False)
class _Mapped:
    """A tile file this cache holds mapped, with the tile shapes it was mapped for."""

    tile_file: TileFile
    tile_shapes: tuple[tuple[int, ...], ...]

    @property
    def nbytes(self) -> int:
        return self.tile_file.n_tiles * self.tile_file.tile_bytes


def _release_fds(fds: list[int]) -> None:
    """Close the cache's descriptors (the lock goes with its fd); run by ``close`` or at collection."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


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
