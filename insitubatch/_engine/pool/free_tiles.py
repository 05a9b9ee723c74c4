"""``FreeTiles``: evicted tiles kept for the decode threads to write into again.

An evicted entry whose tiles the engine decoded itself and nobody else
references gives them to a free list keyed by shape and dtype; a decode
takes its destination from it, so a pass past its budget reuses the same
pages instead of faulting in fresh ones and fragmenting the heap. The pool
bounds what the list keeps (see ``ChunkPool._make_room``) and guards it
with its lock.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np

__all__ = ["FreeTiles"]

# references to a tile that only the check itself holds: the tiles list it was
# taken from, the loop variable and getrefcount's argument
_OWN_TILE_REFS = 3
# ... and to that tiles list: the evicting caller's local name, ``keep``'s parameter and getrefcount's argument
_OWN_LIST_REFS = 3


class FreeTiles:
    """Tiles nobody references, by ``(shape, dtype)``; not thread-safe (the pool's lock guards it)."""

    def __init__(self) -> None:
        self._tiles: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}
        self.nbytes = 0
        self.reused = 0  # tiles handed out again

    def keep(self, tiles: list[np.ndarray | None], room: int) -> int:
        """Keep up to ``room`` bytes of an evicted entry's tiles; returns the room left.

        A ready entry's tiles are read only by gathers of the passes that pin
        it, so once it is unpinned the references counted here are the only
        ones; the count is checked anyway (a view, a tensor or an exported
        buffer of a tile holds a reference to it), and a tile that does not
        own its memory is never kept.
        """
        if sys.getrefcount(tiles) > _OWN_LIST_REFS:
            return room  # someone still holds the list itself
        for tile in tiles:
            if (
                tile is None
                or tile.base is not None
                or not tile.flags.owndata
                or not tile.flags.writeable
                or tile.nbytes > room
                or sys.getrefcount(tile) > _OWN_TILE_REFS
            ):
                continue
            room -= tile.nbytes
            self._tiles.setdefault((tile.shape, tile.dtype), []).append(tile)
            self.nbytes += tile.nbytes
        return room

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A kept tile of ``shape`` and ``dtype`` (stale contents), or None."""
        kept = self._tiles.get((shape, dtype))
        if not kept:
            return None
        tile = kept.pop()
        self.nbytes -= tile.nbytes
        self.reused += 1
        return tile

    def __iter__(self) -> Iterator[np.ndarray]:
        """Every kept tile."""
        for kept in self._tiles.values():
            yield from kept

    def clear(self) -> None:
        self._tiles.clear()
        self.nbytes = 0
