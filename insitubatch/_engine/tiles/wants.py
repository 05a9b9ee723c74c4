"""Stored tiles a pass waits to read, and the entries that want their pieces.

Views of one array with different selections are different read sources,
each with entries of its own. When they need the same stored tile of the
same sample-axis chunk (the planner admits them side by side), the tile is
read and decoded once, then cut for each of them: the second source's
entry joins the first's ``Want`` while it still waits for its job.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..pool.entry import FAILED, Entry
from ..reads.reader import ArrayReader
from ..reads.shard_index import IndexSlot, SplitIndexes

__all__ = ["Consumer", "Want", "Wants"]

# who wants a stored tile's pieces: an entry, its source's reader, and the tile's index among its reads
Consumer = tuple[Entry, ArrayReader, int]


@dataclass(eq=False)
class Want:
    """One stored tile of one sample-axis chunk a pass needs, and every entry that wants its pieces.

    ``seal`` closes it to newcomers when its job starts.
    """

    path: str
    chunk_index: int
    tile: int  # the tile's index in the field's full tile grid
    consumers: list[Consumer]
    wants: Wants
    ticket: int | None = None  # its place in the read permits' queue (``window.ReadWindow.ticket``): admission
    sealed: bool = False
    index_slot: IndexSlot | None = (
        None  # an inner chunk's: its shard's index slot, held from admission (``reads.shard_index``)
    )

    def seal(self) -> list[Consumer]:
        """Decode thread: close it to newcomers; the consumers whose entry has not failed."""
        with self.wants.lock:
            self.sealed = True
            key = (self.path, self.chunk_index, self.tile)
            if self.wants.open.get(key) is self:
                del self.wants.open[key]
            return [c for c in self.consumers if c[0].state != FAILED]


@dataclass(eq=False)
class Wants:
    """A pass's stored tiles waiting to be read, by ``(array path, chunk, tile)``.

    An inner chunk of a shard takes its shard's index slot from ``indexes``
    (the split's cache; ``stages`` by array path) as it is first wanted:
    the cache learns the order tiles come in here, and only here.
    """

    indexes: SplitIndexes = field(default_factory=SplitIndexes)
    stages: Mapping[str, Any] = field(default_factory=dict)  # ``io.decode.shard_stage`` of each sharded array
    open: dict[tuple[str, int, int], Want] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, entry: Entry, reader: ArrayReader, chunk_index: int, ticket: int | None = None) -> list[Want]:
        """Loop: ``entry`` wants its tiles; each joins a waiting read of the same tile, the rest are new reads
        (holding ``ticket``)."""
        path = reader.geometry.path
        fresh: list[Want] = []
        with self.lock:
            for k, t in enumerate(reader.layout.tiles):
                want = self.open.get((path, chunk_index, t))
                if want is not None and not want.sealed:
                    want.consumers.append((entry, reader, k))  # decoded once for both selections
                    continue
                want = self.open[(path, chunk_index, t)] = Want(
                    path, chunk_index, t, [(entry, reader, k)], self, ticket
                )
                fresh.append(want)
        stage = self.stages.get(path)
        if stage is not None:
            for want in fresh:
                key = reader.geometry.tile_key(reader.tile_coord(chunk_index, want.consumers[0][2]))[0]
                want.index_slot = self.indexes.touch(key, stage)
        return fresh
