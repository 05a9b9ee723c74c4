"""Stores that hold or fail chunk writes, and the write-behind worker spawned and killed (no tests here)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from write_helpers import BATCH, GROUP, WORKER_TIMEOUT_S, predictions
from zarr.abc.buffer import Buffer
from zarr.abc.store import Store
from zarr.storage import LocalStore, WrapperStore

from insitubatch.write import SlotWriter

# how often a held write looks whether the gate opened
POLL_S = 0.002


def is_chunk(key: str) -> bool:
    """A chunk (or shard) of an output array: what ``SlotWriter.write`` stores, never metadata or records."""
    return "/c/" in key and "/.insitubatch/" not in key


class GatedStore(WrapperStore):
    """Parks every chunk write until ``open()``; fails chunk writes whose key is in ``fail_keys``; delays them."""

    def __init__(self, store: Store, *, fail_keys: frozenset[str] = frozenset(), delay_s: float = 0.0) -> None:
        super().__init__(store)
        self.fail_keys = fail_keys
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.gate.set()
        self.chunk_sets = 0
        self.failed = threading.Event()  # set once an injected failure was raised
        self.parked = threading.Event()  # set once a chunk write waits at the closed gate

    def _with_store(self, store: Store) -> GatedStore:
        return type(self)(store, fail_keys=self.fail_keys, delay_s=self.delay_s)

    def close_gate(self) -> None:
        self.gate.clear()

    def open_gate(self) -> None:
        self.gate.set()

    async def set(self, key: str, value: Buffer) -> None:
        if is_chunk(key):
            if not self.gate.is_set():
                self.parked.set()
            while not self.gate.is_set():  # never block zarr's loop: poll
                await asyncio.sleep(POLL_S)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if key in self.fail_keys:
                self.failed.set()
                raise OSError(f"injected failure writing {key}")
            self.chunk_sets += 1
        await super().set(key, value)


def killed_behind_worker(path: str, start: int, stop: int, depth: int, ready_file: str, delay_s: float) -> None:
    """Write ``[start, stop)`` behind a slow store; after ``depth + 1`` calls say so and go on until killed."""
    store = GatedStore(LocalStore(path), delay_s=delay_s)
    writer = SlotWriter(store, start, stop, group=GROUP, write_behind=depth)
    writer.open()
    calls = 0
    for lo in range(start, stop, BATCH):
        hi = min(lo + BATCH, stop)
        for name, values in predictions(lo, hi).items():
            writer.write(name, (lo, hi), values)
            calls += 1
            if calls == depth + 1:  # the queue is full and writes are still to land: kill us now
                Path(ready_file).write_text(str(os.getpid()))
    time.sleep(WORKER_TIMEOUT_S)  # never completes: the parent SIGKILLs us first
