"""``HeldChunks``: the tile files one ``DiskCache`` holds mapped, and the spill files it made.

A chunk is held from the moment ``find`` revives it or ``commit`` publishes
it until ``evict`` or ``close``; releasing it closes the cache's mapping
(a view handed out keeps the bytes mapped until it dies). Spill files
(without ``persist``) are the holder's own: deleted on eviction and on close.
A closed holder holds nothing and takes nothing.

Not thread-safe on its own: the ``DiskCache`` calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .log import Key
from .tilefile import TileFile, tile_view

__all__ = ["HeldChunk", "HeldChunks"]


@dataclass(eq=False)
class HeldChunk:
    """A tile file this cache holds mapped, with the tile shapes it was mapped for."""

    tile_file: TileFile
    tile_shapes: tuple[tuple[int, ...], ...]

    @property
    def nbytes(self) -> int:
        return self.tile_file.n_tiles * self.tile_file.tile_bytes

    def views(self) -> list[np.ndarray]:
        """Each tile as a read-only zero-copy view of its real shape."""
        return [tile_view(self.tile_file, i, s) for i, s in enumerate(self.tile_shapes)]


class HeldChunks:
    """The chunks one cache over ``cache_dir`` holds mapped, by ``(array_path, chunk_index)``."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.closed = False
        self._mapped: dict[Key, HeldChunk] = {}
        self._spilled: set[Path] = set()

    def check_open(self) -> None:
        """Raise ``ValueError`` once the cache is closed."""
        if self.closed:
            raise ValueError(f"DiskCache over {str(self.cache_dir)!r} is closed")

    def get(self, key: Key) -> HeldChunk | None:
        return self._mapped.get(key)

    def hold(
        self, key: Key, tile_file: TileFile, tile_shapes: tuple[tuple[int, ...], ...], *, spill: bool
    ) -> HeldChunk:
        """Hold ``tile_file`` for the chunk (a ``spill`` file is this cache's to delete); an older mapping is released."""
        old = self._mapped.pop(key, None)
        if old is not None:
            old.tile_file.close()
        held = self._mapped[key] = HeldChunk(tile_file, tile_shapes)
        if spill:
            self._spilled.add(tile_file.path)
        return held

    def evict(self, key: Key) -> None:
        """Release the chunk's mapping, deleting it when it is a spill file; a no-op when it is not held."""
        held = self._mapped.pop(key, None)
        if held is None:
            return
        held.tile_file.close()
        path = held.tile_file.path
        if path in self._spilled:
            path.unlink(missing_ok=True)
            self._spilled.discard(path)

    @property
    def nbytes(self) -> int:
        """Tile-file bytes held mapped now."""
        return sum(m.nbytes for m in self._mapped.values())

    def __len__(self) -> int:
        return len(self._mapped)

    def close(self) -> None:
        """Release every mapping and delete every spill file; from now on the cache takes nothing. Idempotent."""
        self.closed = True
        for held in self._mapped.values():
            held.tile_file.close()
        self._mapped.clear()
        for p in self._spilled:
            p.unlink(missing_ok=True)
        self._spilled.clear()
