"""``TileJobs``: the decode-thread side of a pass: read, decode, transform, assemble and persist one tile.

The loop side (admission, permits, teardown) is the driver's and the tile
sources'; everything here runs on the decode pool. A job lands what it
decoded in the pool (which owns residency) and lists a tile it replaced
under ``on_bad_chunk="nan"`` in the epoch's bad-chunk records.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
from zarr.abc.buffer import BufferPrototype
from zarr.abc.store import ByteRequest, RangeByteRequest

from ...errors import BadChunkError, StoreReadError
from ...io.chain import ShardStage
from ...io.decode import ChunkDecoder
from ...io.direct import ChunkData, DecodeFailure, as_uint8
from ...io.geometry import ArrayGeometry
from ...stores.local_files import FileChangedError
from ..pool.chunk_pool import FAILED, ChunkPool, Entry, Owner
from ..reads.reader import ArrayReader, BadChunkRecord, fill_value_of
from ..reads.shard_index import IndexSlot, SplitIndexes, check_span
from .finishing import BAD_TILE, BadTile, ChunkFinisher
from .kernels import fill_region, select_block
from .landings import Tally
from .local_groups import PLACED, LocalGroups, decode_buffer, decode_group
from .wants import Consumer, Want

__all__ = ["GET_IN_JOB", "TileJobs"]

# a tile job's ``buf`` when the job reads the key itself (a store with a synchronous get)
GET_IN_JOB = object()


class TileJobs:
    """A pass's decode jobs: each reads (on a sync store), decodes and places tiles, and lands them in the pool."""

    def __init__(
        self,
        *,
        pool: ChunkPool,
        owner: Owner,
        finisher: ChunkFinisher,
        on_bad_chunk: str,
        bad_chunks: list[BadChunkRecord],
        decoders: Mapping[str, ChunkDecoder],
        kinds: Mapping[str, int],
        shards: Mapping[str, ShardStage],
        shard_indexes: SplitIndexes,
        get_sync: Callable[..., ChunkData | None] | None,
        prototype: BufferPrototype,
        groups: LocalGroups | None,
    ) -> None:
        self.pool = pool
        self.owner = owner
        self.finisher = finisher
        self.on_bad_chunk = on_bad_chunk
        self.bad_chunks = bad_chunks  # the epoch's records of replaced tiles, shared by its passes
        self.decoders = decoders
        self.kinds = kinds  # per array path: the tilegroup kernel's codec kind (sample-first zstd/blosc arrays)
        self.shards = shards  # per array path read by inner chunk: its sharding stage (index and inner chains)
        self.shard_indexes = shard_indexes
        self.get_sync = get_sync
        self.prototype = prototype
        self.groups = groups
        self.stopping = False  # the pass is stopping: a group job places nothing more
        self._scratches = threading.local()  # per decode thread: a whole stored chunk per shape (edge tiles)

    def stop(self) -> None:
        """Any thread: jobs that start from now on place nothing (their permits and entries go back as usual)."""
        self.stopping = True

    def record_bad(self, entry: Entry | None, record: BadChunkRecord) -> None:
        """List a tile replaced under ``on_bad_chunk="nan"`` once per epoch, and on its entry for later hits."""
        with self.pool.lock:  # from the loop (hits) and the decode threads (replaced tiles)
            if entry is not None:
                entry.bad_records.append(record)
            if record not in self.bad_chunks:
                self.bad_chunks.append(record)

    @staticmethod
    def read_error(g: ArrayGeometry, coord, key: str, exc: BaseException) -> StoreReadError:
        place = g.tile_key(coord)[1]
        where = f"key {key!r}" + (f", inner chunk {place}" if place is not None else "")
        return StoreReadError(f"reading array {g.path!r} chunk {coord} ({where}) failed: {type(exc).__name__}: {exc}")

    def tile_job(self, want: Want, coord, key: str, buf) -> None:
        """Decode thread: one stored tile from its bytes (or its key, on a sync store) into every entry that wants it."""
        consumers = want.seal()
        if not consumers:
            return
        tally = Tally()
        try:
            landed = self._tile(consumers, want.chunk_index, coord, key, buf, tally, want.index_slot)
        except Exception as exc:  # a store or bad-chunk failure (or a bug): the wanting entries' waiters raise it
            for entry, _, _ in consumers:
                self.pool.fail(entry, exc)
            return
        finally:
            tally.add_to(self.owner.counters, self.pool.lock)
        if landed:
            self.pool.deliver_many(landed)

    def landed_job(self, arrived: list[tuple[Want, Any, str, Any]]) -> None:
        """Decode thread: tiles whose bytes came in one loop iteration, ``(want, coord, key, bytes)`` each, landed
        with one pool wake-up; a tile's failure fails the entries that want it only.

        The tiles the group kernel takes are decoded in one call per codec and
        rank (``_kernel_landed``); the rest, and any it hands back, one by one.
        """
        tally = Tally()
        landed: list[tuple[Entry, int, np.ndarray]] = []
        try:
            live = [
                (want, consumers, coord, key, buf) for want, coord, key, buf in arrived if (consumers := want.seal())
            ]
            for want, consumers, coord, key, buf, kernel in self._kernel_landed(live, tally, landed):
                try:
                    landed.extend(
                        self._tile(consumers, want.chunk_index, coord, key, buf, tally, want.index_slot, kernel)
                    )
                except Exception as exc:  # a bad chunk (or a bug): the wanting entries' waiters raise it
                    for entry, _, _ in consumers:
                        self.pool.fail(entry, exc)
        finally:
            tally.add_to(self.owner.counters, self.pool.lock)
        self.pool.deliver_many(landed)

    def _kernel_landed(
        self, live: list[tuple[Want, list[Consumer], Any, str, Any]], tally: Tally, landed: list
    ) -> list:
        """Decode the landed tiles the kernel takes, GIL released once per codec and rank; returns the others,
        each with whether the per-tile path may still try the kernel (not for one it handed back).

        The kernel takes a zstd/blosc tile of a sample-first array with bytes
        (not missing, not found bad on the loop) that a view without a
        selection keeps whole: it decodes into that view's tile, which the
        other views' selections are then cut from, as ``_tile`` does. A tile
        it hands back (a frame that does not declare the chunk's size, a
        codec error) goes the general path, which raises or falls back.
        """
        by_kind: dict[tuple[int, int], tuple[list, list[np.ndarray], list[np.ndarray], list[tuple[int, ...]]]] = {}
        whole_bytes = 0  # the largest stored chunk: an edge tile's whole chunk decodes there first
        rest = []
        for item in live:
            want, consumers, _, _, buf = item
            path = consumers[0][1].geometry.path
            kind = self.kinds.get(path, 0) if buf is not None and not isinstance(buf, BadChunkError) else 0
            whole = next((c for c in consumers if c[1].layout.identity), None) if kind else None
            if whole is None:
                rest.append((*item, True))
                continue
            decoder = self.decoders[path]
            items, raws, dests, stored = by_kind.setdefault((kind, len(decoder.shape)), ([], [], [], []))
            items.append(item)
            raws.append(as_uint8(buf))
            dests.append(self.pool.take_tile(whole[1].tile_rows_shape(want.chunk_index, whole[2]), decoder.dtype))
            stored.append(decoder.shape)
            whole_bytes = max(whole_bytes, decoder.dtype.itemsize * math.prod(decoder.shape))
        if not by_kind:
            return rest
        scratch = self._scratch((whole_bytes,), np.dtype(np.uint8))
        trace = self.owner.counters.trace
        for (kind, _), (items, raws, dests, stored) in by_kind.items():
            status, decode_ns = decode_group(kind, raws, dests, stored, scratch)
            trace.add("decode_s", decode_ns / 1e9)
            for item, dest, placed in zip(items, dests, status.tolist()):
                if placed != PLACED:
                    rest.append((*item, False))  # the general path decides it, without the kernel again
                    continue
                want, consumers = item[0], item[1]
                tally.decoded_tiles += 1
                try:
                    landed.extend(
                        self._finish(consumers, want.chunk_index, self._pieces(consumers, want.chunk_index, dest))
                    )
                except Exception as exc:  # a transform's failure (or a bug): the wanting entries' waiters raise it
                    for entry, _, _ in consumers:
                        self.pool.fail(entry, exc)
        return rest

    def group_job(self, group: list[Want]) -> None:
        """Decode thread: read, decode and place a group of tiles, landing them with one pool wake-up.

        Tiles the group kernel can take are read and decoded in one call
        (``local_groups``); the rest, and any it hands back, one by one. A
        tile's failure fails the entries that want it only.
        """
        live = [(want, consumers) for want in group if (consumers := want.seal())]
        if self.stopping:
            return
        try:
            self._place_group(live)
        except Exception as exc:  # a bug, not a bad chunk (those fail their own entry): the group's entries raise it
            for _, consumers in live:
                for entry, _, _ in consumers:
                    self.pool.fail(entry, exc)

    def _place_group(self, live: list[tuple[Want, list[Consumer]]]) -> None:
        tally = Tally()
        landed: list[tuple[Entry, int, np.ndarray]] = []
        rest = live if self.groups is None else self._kernel_tiles(live, tally, landed)
        for want, consumers in rest:
            consumers = [c for c in consumers if c[0].state != FAILED]
            if self.stopping or not consumers:
                continue  # the pass is stopping, or other tiles of the chunks already failed them
            _, reader, k = consumers[0]
            coord = reader.tile_coord(want.chunk_index, k)
            key = reader.geometry.tile_key(coord)[0]
            try:
                landed.extend(self._tile(consumers, want.chunk_index, coord, key, GET_IN_JOB, tally, want.index_slot))
            except Exception as exc:  # a store or bad-chunk failure (or a bug): the wanting entries' waiters raise it
                for entry, _, _ in consumers:
                    self.pool.fail(entry, exc)
        tally.add_to(self.owner.counters, self.pool.lock)
        self.pool.deliver_many(landed)

    def _kernel_tiles(self, group: list[tuple[Want, list[Consumer]]], tally: Tally, landed: list) -> list:
        """Place the group's tiles the kernel takes; returns the others (and those it handed back).

        The kernel decodes straight into one entry's memory, so it takes a
        tile wanted by one view without a selection; a tile cut into pieces,
        or wanted by several selections, goes the general path.
        """
        groups = self.groups
        assert groups is not None  # called only for a local directory
        # one kernel call per codec and rank: a call's tiles share both
        by_kind: dict[tuple[int, int], tuple[list, list[bytes], list[np.ndarray], list[tuple[int, ...]]]] = {}
        rest = []
        for item in group:
            want, consumers = item
            entry, reader, k = consumers[0]
            g = reader.geometry
            kind = groups.kinds.get(g.path, 0) if len(consumers) == 1 and reader.layout.identity else 0
            path = groups.files.path_of(g.tile_key(reader.tile_coord(want.chunk_index, k))[0]) if kind else None
            if path is None:
                rest.append(item)
                continue
            decoder = self.decoders[g.path]
            items, paths, dests, stored = by_kind.setdefault((kind, len(decoder.shape)), ([], [], [], []))
            items.append(item)
            paths.append(os.fsencode(path))
            dests.append(self.pool.take_tile(reader.tile_rows_shape(want.chunk_index, k), decoder.dtype))
            stored.append(decoder.shape)
        for (kind, _), (items, paths, dests, stored) in by_kind.items():
            status, nbytes, times = groups.run(kind, paths, dests, stored)
            trace = self.owner.counters.trace
            trace.add("fetch_s", float(times[0]) / 1e9)
            trace.add("decode_s", float(times[1]) / 1e9)
            for item, dest, placed, size in zip(items, dests, status.tolist(), nbytes.tolist()):
                if placed != PLACED:
                    rest.append(item)  # the general path reads it again and raises or falls back
                    continue
                tally.gets += 1
                tally.get_bytes += size
                tally.decoded_tiles += 1
                entry, _, k = item[1][0]
                landed.append((entry, k, dest))
        return rest

    def _tile(
        self,
        consumers: list[Consumer],
        chunk_index: int,
        coord,
        key: str,
        buf,
        tally: Tally,
        slot: IndexSlot | None = None,
        kernel: bool = True,
    ) -> list[tuple[Entry, int, np.ndarray]]:
        """Decode thread: read (``buf`` is ``GET_IN_JOB``; an inner chunk after ``slot``'s index) and decode one
        stored tile, then cut it for each consumer.

        Every consumer is ``(entry, reader, k)``: read tile ``k`` of
        ``reader``'s chunk ``chunk_index``, the same stored tile for all of
        them (views of one array with different selections). The tile is
        decoded once, into the memory of the consumer that keeps it whole (a
        view without a selection) if there is one, else into scratch. Returns
        the pieces ``(entry, piece index, array)`` for the caller to deliver;
        pieces of transformed chunks (assembled first when they hold
        several), or of persisted ones, are staged instead. A store failure
        raises ``StoreReadError``; a bad chunk under ``on_bad_chunk="raise"``
        raises ``BadChunkError``. ``kernel=False``: a tile the group kernel
        handed back, decoded without it. The caller
        adds ``tally`` to the counters before the pieces land, so a consumer
        that saw the data sees them too.
        """
        _, first, k0 = consumers[0]
        g = first.geometry
        whole = next((c for c in consumers if c[1].layout.identity), None)
        decoder_reader, k = (whole[1], whole[2]) if whole is not None else (first, k0)
        tiles: dict[int, list[tuple[int, np.ndarray | BadTile]]] = {}
        try:
            if buf is GET_IN_JOB:
                buf = self._timed_read(g, coord, key, tally, slot)
            elif isinstance(buf, BadChunkError):  # the loop's read found the bytes bad (a shard index, a short range)
                raise buf
            data = self._decode(decoder_reader, chunk_index, k, coord, buf, kernel)
            tiles = self._pieces(consumers, chunk_index, data)
        except BadChunkError:
            if self.on_bad_chunk == "raise":
                raise
            for i, (entry, reader, ck) in enumerate(consumers):
                tiles[i] = self._bad_tile(reader, chunk_index, ck)
                # never persisted: a later run retries the read
                self.record_bad(entry, BadChunkRecord(g.path, chunk_index, reader.tile_inner_coord(ck)))
            self.owner.counters.trace.add("bad_tiles", 1)
        tally.decoded_tiles += 1
        return self._finish(consumers, chunk_index, tiles)

    def _pieces(
        self, consumers: list[Consumer], chunk_index: int, data: np.ndarray
    ) -> dict[int, list[tuple[int, np.ndarray | BadTile]]]:
        """Decode thread: each consumer's pieces of a decoded stored tile, by consumer: the tile itself for a view
        without a selection, else its selection cut into pool memory (cut first: the whole view's tile may be
        transformed in place by ``_finish``)."""
        tiles: dict[int, list[tuple[int, np.ndarray | BadTile]]] = {}
        for i, (_, reader, ck) in enumerate(consumers):
            if reader.layout.identity:
                tiles[i] = [(ck, data)]
            else:
                tiles[i] = self._cut(reader, chunk_index, ck, data)
        return tiles

    def _finish(
        self, consumers: list[Consumer], chunk_index: int, tiles: dict[int, list[tuple[int, np.ndarray | BadTile]]]
    ) -> list[tuple[Entry, int, np.ndarray]]:
        """Decode thread: transform and stage (a pipeline, the disk cache) each consumer's pieces, or list them to
        land: the pieces ``(entry, piece index, array)`` for the caller to deliver."""
        landed: list[tuple[Entry, int, np.ndarray]] = []
        for i, (entry, reader, _) in enumerate(consumers):
            pieces = tiles[i]
            if reader.pipeline and reader.layout.n_pieces == 1:
                ((p, piece),) = pieces
                if not isinstance(piece, BadTile):
                    pieces = [(p, self.finisher.transform(reader, chunk_index, piece))]
            # a transformed chunk lands whole, at its output's origin (``ChunkFinisher``): its rank may differ
            if reader.pipeline or self.finisher.cache is not None:
                for p, piece in pieces:
                    self.finisher.stage(entry, reader, chunk_index, p, piece)
                continue
            # only a chunk that assembles marks a piece, and it was staged
            landed.extend((entry, p, cast(np.ndarray, piece)) for p, piece in pieces)
        return landed

    def _timed_read(self, g: ArrayGeometry, coord, key: str, tally: Tally, slot: IndexSlot | None) -> ChunkData | None:
        """Decode thread: ``_read_tile_sync``, timed; a store failure becomes ``StoreReadError``, bad bytes stay bad."""
        t0 = time.perf_counter()
        try:
            return self._read_tile_sync(g, coord, key, tally, slot)
        except BadChunkError:
            raise
        except Exception as exc:
            raise self.read_error(g, coord, key, exc) from exc
        finally:
            self.owner.counters.trace.add("fetch_s", time.perf_counter() - t0)

    def _read_tile_sync(
        self, g: ArrayGeometry, coord, key: str, tally: Tally, slot: IndexSlot | None
    ) -> ChunkData | None:
        """Decode thread: a tile's bytes from a store that reads on this thread (None: missing, the fill value).

        An inner chunk of a shard is read by byte range, after the shard's
        index (``slot``: held by the split's index cache since the tile was admitted).
        """
        get = self.get_sync
        assert get is not None  # GET_IN_JOB is sent only for a store that reads synchronously
        if not g.sharded_reads:
            buf = get(key, prototype=self.prototype)
            tally.gets += 1
            tally.get_bytes += 0 if buf is None else len(buf)
            return buf
        stored, place = g.tile_key(coord)
        assert place is not None and slot is not None  # sharded reads place every tile in its shard, admitted
        decoder = self.decoders[g.path]
        # a local directory's files tell their version (``LocalFiles.versioned``): inner chunks are read on the
        # condition that the shard is still the file its index was read from; another store's get tells none
        versioned = getattr(get, "versioned", None)

        def get_index(key: str, byte_range: ByteRequest) -> tuple[ChunkData | None, str | None]:
            if versioned is None:
                buf, tag = get(key, prototype=self.prototype, byte_range=byte_range), None
            else:
                buf, tag = versioned(key, prototype=self.prototype, byte_range=byte_range)
            tally.gets += 1  # (counted like a tile's)
            tally.get_bytes += 0 if buf is None else len(buf)
            return buf, tag

        def read(slot: IndexSlot) -> tuple[tuple[int, int] | None, ChunkData | None]:
            try:
                index = self.shard_indexes.read_sync(slot, get_index)
                span = None if index is None else index.span(place)
            except DecodeFailure as exc:
                raise decoder.bad_chunk(coord, str(exc)) from exc.__cause__
            if span is None:
                return None, None  # the shard, or this inner chunk of it, was never written
            chunk = RangeByteRequest(*span)
            if slot.tag is None:
                buf = get(stored, prototype=self.prototype, byte_range=chunk)
            else:
                assert versioned is not None  # (only a versioned read tags an index)
                buf, _ = versioned(stored, prototype=self.prototype, byte_range=chunk, version=slot.tag)
            tally.gets += 1
            tally.get_bytes += 0 if buf is None else len(buf)
            return span, buf

        try:
            span, buf = read(slot)
        except FileChangedError:  # the shard changed since its index was read: the index anew, once
            assert slot.tag is not None
            self.shard_indexes.let_go(stored, slot.tag)
            try:
                span, buf = read(self.shard_indexes.touch(stored, slot.stage))
            except FileChangedError as exc:
                why = "the shard changed while it was read, and again after its index was read anew: it kept changing"
                raise decoder.bad_chunk(coord, why) from exc
        return None if span is None else check_span(decoder, coord, span, buf)

    def _cut(
        self, reader: ArrayReader, chunk_index: int, tile: int, data: np.ndarray
    ) -> list[tuple[int, np.ndarray | BadTile]]:
        """Decode thread: a decoded read tile as its pieces (itself, without a selection), each in pool memory."""
        layout = reader.layout
        if layout.identity:
            return [(tile, data)]
        n = data.shape[0]
        out: list[tuple[int, np.ndarray | BadTile]] = []
        for p in layout.by_tile[tile]:
            piece = layout.pieces[p]
            dest = self.pool.take_tile((n, *piece.shape), data.dtype)
            select_block(dest, data, piece)
            out.append((p, dest))
        return out

    def _decode(self, reader: ArrayReader, chunk_index: int, tile: int, coord, buf, kernel: bool = True) -> np.ndarray:
        """Decode one stored chunk into a sample-first tile of its own, clipped to the array (decode thread).

        Under a selection the tile goes to this thread's scratch instead, to be
        cut into pieces (``_cut``) before the thread decodes again.

        A zstd or blosc tile of a sample-axis-0 array goes through the
        tilegroup kernel. Otherwise a full tile of a sample-axis-0 array is
        decoded straight into the tile's own memory, a clipped one into a
        per-thread scratch chunk and its valid part copied; any other is
        decoded whole and its clipped, sample-first part copied once. The
        destination comes from the pool
        (``ChunkPool.take_tile``: an evicted tile nobody references, or new
        memory) and is overwritten whole. Either way the tile owns its memory:
        it never aliases the store's or a codec's buffers, and is writeable.
        """
        g = reader.geometry
        t0 = time.perf_counter()
        decoder = self.decoders[g.path]
        shape = reader.tile_rows_shape(chunk_index, tile)
        take = self.pool.take_tile if reader.layout.identity else functools.partial(self._scratch, use="cut")
        kind = self.kinds.get(g.path, 0) if buf is not None and kernel else 0
        data = self._kernel_tile(kind, buf, shape, decoder, take) if kind else None
        if data is None:
            data = self._general_tile(reader, chunk_index, tile, coord, buf, shape, decoder, take)
        self.owner.counters.trace.add("decode_s", time.perf_counter() - t0)
        return data

    def _kernel_tile(
        self, kind: int, buf, shape: tuple[int, ...], decoder: ChunkDecoder, take: Callable[..., np.ndarray]
    ) -> np.ndarray | None:
        """Decode thread: a zstd/blosc tile of a sample-first array, frame checks, decode and an edge's copy in C.

        None when the kernel hands it back (the general path then raises or falls back).
        """
        dest = take(shape, decoder.dtype)  # stale contents: overwritten whole when placed
        whole = self._scratch(decoder.shape, decoder.dtype).reshape(-1).view(np.uint8)
        return dest if decode_buffer(kind, as_uint8(buf), dest, decoder.shape, whole) == PLACED else None

    def _general_tile(
        self,
        reader: ArrayReader,
        chunk_index: int,
        tile: int,
        coord,
        buf,
        shape: tuple[int, ...],
        decoder: ChunkDecoder,
        take: Callable[..., np.ndarray],
    ) -> np.ndarray:
        """Decode thread: a tile through the decoder's chain, then its clipped, sample-first part into ``take``'s memory.

        The destination (pool memory, or scratch to cut) is overwritten whole.
        """
        g = reader.geometry
        if g.sample_axis == 0 and shape == decoder.shape:
            data = take(shape, decoder.dtype)
            decoder.decode_into(buf, coord, data)
        elif g.sample_axis == 0:  # a clipped edge tile: whole into this thread's scratch, then its valid part
            whole = self._scratch(decoder.shape, decoder.dtype)
            decoder.decode_into(buf, coord, whole)
            data = take(shape, decoder.dtype)
            np.copyto(data, whole[reader.clip(chunk_index, tile)])
        else:
            raw = decoder(buf, coord)
            data = take(shape, raw.dtype)
            np.copyto(data, np.moveaxis(raw[reader.clip(chunk_index, tile)], g.sample_axis, 0))
        return data

    def _scratch(self, shape: tuple[int, ...], dtype: np.dtype, use: str = "edge") -> np.ndarray:
        """Decode thread: this thread's array of ``shape`` for ``use``, reused by its every tile (no allocation).

        ``"edge"``: a whole edge chunk, decoded before its valid part is
        clipped out. ``"cut"``: a decoded tile cut into pieces at once. Freed
        with the pass's ``TileJobs``.
        """
        arrays = getattr(self._scratches, use, None)
        if arrays is None:
            arrays = {}
            setattr(self._scratches, use, arrays)
        whole = arrays.get((shape, dtype))
        if whole is None:
            whole = arrays[(shape, dtype)] = np.empty(shape, dtype=dtype)
        return whole

    def _bad_tile(self, reader: ArrayReader, chunk_index: int, tile: int) -> list[tuple[int, np.ndarray | BadTile]]:
        """A bad tile's stand-in pieces: NaN for floats, else the fill value (then transformed like any piece).

        The pieces of a chunk that is assembled before its transforms are
        only marked; the ``ChunkFinisher`` fills their rectangles of the chunk in place.
        """
        g = reader.geometry
        if reader.assembles:
            return [(p, BAD_TILE) for p in reader.layout.by_tile[tile]]
        shape = reader.tile_rows_shape(chunk_index, tile)
        data = np.empty(shape, dtype=g.dtype)
        fill_region(data, (0,) * data.ndim, shape, fill_value_of(g))
        return self._cut(reader, chunk_index, tile, data)
