"""Receive buffers used again: never while anything still refers to a body, always within their bound."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
from zarr.core.buffer import default_buffer_prototype

from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.store_link import client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch._wire.bodies import MIN_SLAB_BYTES, SLAB_STEP_BYTES, BodyBuffers
from insitubatch._wire.engine_client import NativeBackend
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.testing.emulator import Emulator

SIZE = 300_000  # an ERA5-shaped chunk's compressed size, over MIN_SLAB_BYTES


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_a_dropped_body_s_slab_is_used_again() -> None:
    bodies = BodyBuffers()
    first = bodies.take(SIZE)
    where = _address(first)
    del first
    again = bodies.take(SIZE - 1000)  # a little smaller: the same slab fits
    assert _address(again) == where and len(again) == SIZE - 1000 and bodies.reused == 1


@pytest.mark.parametrize(
    "hold",
    [
        lambda body: body,
        lambda body: body[10:20],  # a slice of the body
        lambda body: body[5:][3:].view(np.int8),  # a view of a view
        lambda body: memoryview(body),
        lambda body: memoryview(body)[100:],
        lambda body: default_buffer_prototype().buffer.from_array_like(body),  # zarr's Buffer, as the fetcher returns
        lambda body: np.frombuffer(memoryview(body), dtype=np.uint8),
    ],
    ids=["body", "slice", "view-of-view", "memoryview", "memoryview-slice", "zarr-buffer", "frombuffer"],
)
def test_a_slab_anything_still_refers_to_is_never_written_over(hold) -> None:
    bodies = BodyBuffers()
    body = bodies.take(SIZE)
    body[:] = 7
    held = hold(body)
    del body
    for _ in range(20):  # every later body lands elsewhere, and writing it leaves the held one as it was
        other = bodies.take(SIZE)
        other[:] = 9
    assert bodies.reused > 0  # (the later bodies, each dropped in turn, share one slab among themselves)
    kept = np.frombuffer(memoryview(held.as_numpy_array() if hasattr(held, "as_numpy_array") else held), np.uint8)
    assert (kept == 7).all()


def test_small_bodies_are_plain_allocations_and_a_slab_serves_only_bodies_near_its_size() -> None:
    bodies = BodyBuffers()
    small = bodies.take(MIN_SLAB_BYTES - 1)
    assert bodies.kept_bytes == 0 and small.base is None  # its own allocation: nothing kept
    big = bodies.take(4 * SLAB_STEP_BYTES)
    where = _address(big)
    del big
    tiny = bodies.take(MIN_SLAB_BYTES)  # half the slab's size: a slab of its own, not the big one
    assert _address(tiny) != where and bodies.reused == 0


def test_the_slabs_kept_stay_within_their_bound_and_clear_lets_them_go() -> None:
    bodies = BodyBuffers(max_kept_bytes=3 * SLAB_STEP_BYTES * 5)
    held = [bodies.take(5 * SLAB_STEP_BYTES) for _ in range(10)]  # all busy: each needs a slab
    assert bodies.kept_bytes == 3 * 5 * SLAB_STEP_BYTES  # three kept, the other seven plain allocations
    assert all(len(h) == 5 * SLAB_STEP_BYTES for h in held)
    bodies.clear()
    assert bodies.kept_bytes == 0
    del held
    assert bodies.take(5 * SLAB_STEP_BYTES) is not None and bodies.reused == 0  # nothing kept to use again


def test_bodies_held_across_many_gets_keep_their_bytes_and_dropped_ones_are_reused(tmp_path: Path) -> None:
    base = tmp_path / "bkt" / "d"
    base.mkdir(parents=True)
    files = {f"d/k{i}": os.urandom(SIZE + 1009 * i) for i in range(24)}
    for key, data in files.items():
        (tmp_path / "bkt" / key).write_bytes(data)
    with Emulator(tmp_path, latency_s=0.0, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("bkt"), read_only=True)
        client = client_for(store)
        assert isinstance(client.backend, NativeBackend)
        fetcher = Fetcher(client, ReadWindow(8).user(8), PassCounters())
        keys = sorted(files)

        async def rounds() -> dict:
            # (one loop throughout: a pool's connections and buffers belong to its loop, as with zarr's)
            held = dict(zip(keys[::2], await asyncio.gather(*(fetcher.get(k) for k in keys[::2]))))
            for _ in range(3):  # rounds whose bodies are dropped at once: their slabs come round again
                for key in keys[1::2]:
                    assert (await fetcher.get(key)).to_bytes() == files[key]
            return held

        held = asyncio.run(rounds())  # every other body held from the first round on
        assert client.backend.pool.bodies.reused > 0
        for key, got in held.items():  # nothing received since wrote over a body still held
            assert got.to_bytes() == files[key]
        store.close()
