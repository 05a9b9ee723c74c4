"""Shared pieces of the parallel-write tests (no tests here).

The functions spawned worker processes run must live in a module the child
can import by name, so they are here rather than inside a test module.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype
from zarr.storage import MemoryStore

from insitubatch._zarr_compat import sync
from insitubatch.errors import WriteClaimError
from insitubatch.write import LayoutSpec, OutputArray, SlotWriter, create_layout

GROUP = "out"
EXTENT = 44  # not a multiple of the alignment: the last slot ends in a partial chunk
# pred: chunk 2, shard 6; count: chunk 4 -> slots align to lcm(2, 6, 4) = 12
ALIGNMENT = 12
BATCH = 5  # indices per write call: deliberately divides neither chunks nor shards
# Generous ceiling on any wait for another process (spawn + imports on a loaded 2-core box).
WORKER_TIMEOUT_S = 90.0
# Exit status of a claim worker that lost the race.
EXIT_LOST = 3


class ManualClock:
    """A clock that moves only when told: ages a claim without sleeping."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def layout_spec(extent: int = EXTENT) -> LayoutSpec:
    """The output layout every parallel-write test writes."""
    return LayoutSpec(
        (
            OutputArray(
                "pred",
                (extent, 3, 8),
                (2, 3, 8),
                "float32",
                shards=(6, 3, 8),
                dimension_names=("time", "channel", "x"),
                fill_value=float("nan"),
            ),
            OutputArray("count", (extent,), (4,), "int32", dimension_names=("time",)),
            OutputArray("x", (8,), (8,), "float64", index_axis=None, dimension_names=("x",)),
        )
    )


def predictions(lo: int, hi: int) -> dict[str, np.ndarray]:
    """Deterministic values for indices ``[lo, hi)`` of every indexed array."""
    t = np.arange(lo, hi, dtype=np.float64)[:, None, None]
    c = np.arange(3)[None, :, None]
    x = np.arange(8)[None, None, :]
    pred = np.sin(0.1 * t + c) * np.cos(0.3 * x) + 0.01 * t
    return {"pred": pred.astype(np.float32), "count": (np.arange(lo, hi) * 7 + 1).astype(np.int32)}


def write_batches(writer: SlotWriter) -> int:
    """Write the writer's whole range in ``BATCH``-sized pieces; returns the write count."""
    writes = 0
    for lo in range(writer.start, writer.stop, BATCH):
        hi = min(lo + BATCH, writer.stop)
        for name, values in predictions(lo, hi).items():
            writer.write(name, (lo, hi), values)
            writes += 1
    return writes


def reference_store(extent: int = EXTENT) -> MemoryStore:
    """The single-writer result: one writer over the whole extent."""
    store = MemoryStore()
    create_layout(store, layout_spec(extent), group=GROUP)
    with SlotWriter(store, 0, extent, group=GROUP) as writer:
        write_batches(writer)
    return store


async def _collect(store: Store, prefix: str) -> dict[str, bytes]:
    proto = default_buffer_prototype()
    out = {}
    async for key in store.list_prefix(prefix):
        buf = await store.get(key, proto)
        if buf is not None:
            out[key] = buf.to_bytes()
    return out


def store_bytes(store: Store, prefix: str = "") -> dict[str, bytes]:
    """Every key under ``prefix`` and its bytes."""
    return sync(_collect(store, prefix))


def array_bytes(store: Store, group: str = GROUP) -> dict[str, bytes]:
    """The bytes of every key of the group except the write records."""
    return {k: v for k, v in store_bytes(store, group + "/").items() if not k.startswith(f"{group}/.insitubatch/")}


# -- functions spawned processes run -------------------------------------------------
def write_worker(store: Store, start: int, stop: int, barrier: Any) -> None:
    """Claim ``[start, stop)``, wait until every writer holds its claim, then write it."""
    with SlotWriter(store, start, stop, group=GROUP) as writer:
        barrier.wait(WORKER_TIMEOUT_S)  # all claims held at once: the writes overlap in time
        write_batches(writer)


def claim_worker(store: Store, start: int, stop: int, ready: Any, attempted: Any) -> None:
    """Race for one claim; exit 0 when this process won it, ``EXIT_LOST`` when refused."""
    writer = SlotWriter(store, start, stop, group=GROUP)
    ready.wait(WORKER_TIMEOUT_S)
    try:
        writer.open()
    except WriteClaimError:
        attempted.wait(WORKER_TIMEOUT_S)
        sys.exit(EXIT_LOST)
    attempted.wait(WORKER_TIMEOUT_S)  # hold the claim until every racer has tried
    writer.close()


def crash_worker(
    store: Store, start: int, stop: int, ready_file: str, heartbeat_s: float, stale_after_s: float
) -> None:
    """Write part of a slot, say so, then hang until killed (the parent SIGKILLs us)."""
    writer = SlotWriter(store, start, stop, group=GROUP, heartbeat_s=heartbeat_s, stale_after_s=stale_after_s)
    writer.open()
    lo, hi = start, start + BATCH
    for name, values in predictions(lo, hi).items():
        writer.write(name, (lo, hi), values)
    Path(ready_file).write_text(str(os.getpid()))
    time.sleep(WORKER_TIMEOUT_S)


def failing_work(writer: SlotWriter) -> int:
    """Runner work that fails on the slot starting at 12 and writes the others."""
    if writer.start == ALIGNMENT:
        raise RuntimeError("model blew up on this slot")
    return write_batches(writer)


def join_all(procs: list[Any]) -> list[int | None]:
    """Each worker's exit code once all ended (``None`` for one still running after ``WORKER_TIMEOUT_S``, then killed)."""
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return codes
