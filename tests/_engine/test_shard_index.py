"""Shard index reads under the read permits: one read per shard takes one permit, in ticket order or in the background."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import zarr
from helpers import local_store
from zarr.buffer import default_buffer_prototype
from zarr.codecs import BytesCodec, ShardingCodec

from insitubatch import open_geometries
from insitubatch._engine.reads.shard_index import (
    HELD_ENTRY_BYTES,
    HELD_INDEX_OVERHEAD_BYTES,
    ShardIndexes,
    SplitIndexes,
    held_index_bytes,
    prefetch,
)
from insitubatch._engine.reads.window import ReadWindow
from insitubatch.io.decode import shard_stage


def _sharded(tmp_path: Path):
    """A sharded v3 array of four shards along time; its geometry, stage and store."""
    root = zarr.open_group(tmp_path / "g.zarr", mode="w")
    arr = root.create_array(
        "v",
        shape=(16, 4),
        chunks=(4, 4),
        dtype="f4",
        serializer=ShardingCodec(chunk_shape=(1, 4), codecs=[BytesCodec()]),
        compressors=None,
        dimension_names=("time", "x"),
    )
    arr[...] = np.arange(64, dtype="f4").reshape(16, 4)
    store = local_store(tmp_path / "g.zarr")
    g = open_geometries(store)["v"]
    return g, shard_stage(g), store


class _Gate:
    """A fetch that counts its calls and waits on an event before answering from the store, at ETag ``tags[call]``."""

    def __init__(self, store, tags: tuple[str | None, ...] = ()) -> None:
        self.store = store
        self.tags = tags  # the shard's ETag at each call (none: the store tells none)
        self.calls: list[str] = []
        self.open = asyncio.Event()

    async def __call__(self, key: str, byte_range):
        self.calls.append(key)
        await self.open.wait()
        tag = self.tags[len(self.calls) - 1] if self.tags else None
        return await self.store.get(key, prototype=default_buffer_prototype(), byte_range=byte_range), tag


def test_readers_of_one_index_share_one_fetch_and_one_permit(tmp_path: Path) -> None:
    g, stage, store = _sharded(tmp_path)
    key = g.chunk_key((1, 0))

    async def main() -> None:
        indexes, window = SplitIndexes(), ReadWindow(4)
        user, fetch = window.user(4), _Gate(store)
        slots = [indexes.touch(key, stage) for _ in range(3)]  # three tiles of the shard admitted: one slot
        readers = [asyncio.ensure_future(indexes.read(slot, fetch, user, window.ticket())) for slot in slots]
        for _ in range(3):
            await asyncio.sleep(0)
        assert fetch.calls == [key] and window.inflight == 1  # the two others wait for that read, holding nothing
        fetch.open.set()
        got = await asyncio.gather(*readers)
        assert got[0] is got[1] is got[2] and got[0] is not None and got[0].offsets.shape == (4, 1)
        assert window.inflight == 0 and indexes.gets == 1

    asyncio.run(main())


def test_a_reading_ahead_index_waits_while_a_tile_read_waits(tmp_path: Path) -> None:
    g, stage, store = _sharded(tmp_path)
    keys = [g.chunk_key((s, 0)) for s in range(4)]

    async def main() -> None:
        indexes, window = SplitIndexes(), ReadWindow(1)
        user, fetch = window.user(1), _Gate(store)
        fetch.open.set()
        assert user.try_acquire()  # a tile read holds the only permit
        ahead = asyncio.ensure_future(prefetch(indexes, [indexes.touch(k, stage) for k in keys], fetch, user, 2))
        tile = asyncio.ensure_future(user.acquire(window.ticket()))  # another tile read waits
        for _ in range(3):
            await asyncio.sleep(0)
        assert fetch.calls == []
        user.release()
        await tile
        assert fetch.calls == [] and window.inflight == 1  # the waiting tile read went first
        user.release()
        await asyncio.wait_for(ahead, 5.0)
        assert sorted(fetch.calls) == sorted(keys) and indexes.gets == 4 and window.inflight == 0

    asyncio.run(main())


def test_a_reader_waiting_on_a_cancelled_index_read_reads_it_itself(tmp_path: Path) -> None:
    # the read another pass started goes away with that pass; a reader that waited on it must not hang or fail
    g, stage, store = _sharded(tmp_path)
    key = g.chunk_key((2, 0))

    async def main() -> None:
        indexes, window = SplitIndexes(), ReadWindow(2)
        user, fetch = window.user(2), _Gate(store)
        slot = indexes.touch(key, stage)
        first = asyncio.ensure_future(indexes.read(slot, fetch, user, window.ticket()))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(indexes.read(slot, fetch, user, window.ticket()))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        fetch.open.set()
        index = await asyncio.wait_for(second, 5.0)
        assert first.cancelled() and index is not None and fetch.calls == [key, key]
        assert indexes.gets == 1 and window.inflight == 0

    asyncio.run(main())


def test_a_split_holds_its_indexes_within_the_budget_least_recently_used_out(tmp_path: Path) -> None:
    g, stage, store = _sharded(tmp_path)
    keys = [g.chunk_key((s, 0)) for s in range(4)]
    each = held_index_bytes(stage)
    assert each == 4 * HELD_ENTRY_BYTES + HELD_INDEX_OVERHEAD_BYTES  # four inner chunks a shard

    async def main() -> None:
        indexes, fetch = SplitIndexes(budget_bytes=2 * each), _Gate(store)
        fetch.open.set()
        first = indexes.touch(keys[0], stage)
        indexes.touch(keys[1], stage)
        indexes.touch(keys[0], stage)  # used again: keys[1] is now the least recent
        third = indexes.touch(keys[2], stage)
        assert [k for k, _ in indexes.held()] == [keys[0], keys[2]] and indexes.evictions == 1
        assert indexes.held_bytes == 2 * each
        # a slot let go is still read for whoever holds it; a later touch of its shard is a new one, read again
        for slot in (first, third, indexes.touch(keys[1], stage), indexes.touch(keys[1], stage)):
            assert await indexes.read(slot, fetch) is not None
        assert fetch.calls == [keys[0], keys[2], keys[1]] and indexes.gets == 3
        assert indexes.get_bytes == 3 * stage.index_nbytes
        assert indexes.nbytes == 2 * 4 * HELD_ENTRY_BYTES  # the entries of the two held

    asyncio.run(main())


def test_each_split_holds_its_own_indexes(tmp_path: Path) -> None:
    g, stage, _ = _sharded(tmp_path)
    book = ShardIndexes(budget_bytes=10 * held_index_bytes(stage))
    key = g.chunk_key((1, 0))
    train, val = book.of("train"), book.of("val")
    assert book.of("train") is train and train.touch(key, stage) is not val.touch(key, stage)


def test_an_index_of_a_version_the_shard_no_longer_is_let_go_and_read_anew(tmp_path: Path) -> None:
    g, stage, store = _sharded(tmp_path)
    key = g.chunk_key((1, 0))

    async def main() -> None:
        indexes, fetch = SplitIndexes(), _Gate(store, tags=('"a"', '"b"'))
        fetch.open.set()
        slot = indexes.touch(key, stage)
        indexes.let_go(key, '"a"')  # not read yet: no version to be stale
        assert indexes.touch(key, stage) is slot
        await indexes.read(slot, fetch)
        assert slot.tag == '"a"'
        indexes.let_go(key, '"b"')  # another version than the one held (read anew already): kept
        assert indexes.touch(key, stage) is slot
        indexes.let_go(key, '"a"')
        assert indexes.held() == [] and indexes.held_bytes == 0
        again = indexes.touch(key, stage)
        assert again is not slot and await indexes.read(again, fetch) is not None
        assert again.tag == '"b"' and fetch.calls == [key, key] and indexes.gets == 2

    asyncio.run(main())
