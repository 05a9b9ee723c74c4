"""TensorStore in the arena: a plain loop reading each batch's samples by index, our samples in our order.

Each variable is opened with TensorStore's ``zarr3`` driver over the same
location (the ``file``, ``http`` or ``s3`` key-value store), all sharing one
``Context`` whose ``cache_pool`` holds as many bytes as our pool's budget
for the same pass (``describe()``'s ``budget_bytes``), so neither keeps more
decoded chunks than the other (in steady state; for one cold pass the parent
gives it a cache that holds the whole split instead, ``cache_is`` saying
which); the data is immutable, so a cached chunk is not revalidated with the store on every read (``recheck_cached_data="open"``,
TensorStore's setting for data that does not change while open). A pass of epoch ``e`` reads the samples our
loader's train pass of epoch ``e`` yields, in its order (``EpochPlan.anchors``,
saved by the parent), ``batch_size`` at a time: ``array[indices].read()``
for every variable, with :data:`BATCHES_AHEAD` batches' reads issued before
the one being waited on (our loader's ``prefetch_depth`` of 2, plus the
batch being assembled). Within one read TensorStore fetches and decodes the
chunks it needs concurrently, bounded by its own defaults (its
``file_io_concurrency``, ``http_request_concurrency`` / ``s3_request_concurrency``
of 32, ``data_copy_concurrency`` of one per core).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..measure import rss_bytes
from ..rows import MB
from .harness import start, time_passes, train_digest

__all__ = ["BATCHES_AHEAD", "kvstore", "run_tensorstore"]

# Batches whose reads are in flight beyond the one the loop waits on: our loader's prefetch_depth (2)
# plus the batch it is assembling.
BATCHES_AHEAD = 3
EMULATOR_REGION = "us-east-1"


def kvstore(location: dict[str, Any], variable: str) -> dict[str, Any]:
    """TensorStore's key-value store spec for one variable's array at an arena location."""
    kind = location["kind"]
    if kind == "file":
        return {"driver": "file", "path": f"{location['path']}/{variable}/"}
    if kind == "http":
        return {"driver": "http", "base_url": f"{location['url']}/{variable}/"}
    if kind == "s3":
        return {
            "driver": "s3",
            "bucket": location["bucket"],
            "path": f"{variable}/",
            "endpoint": location["endpoint"],
            "aws_region": EMULATOR_REGION,
            "aws_credentials": {"type": "anonymous"},
        }
    raise ValueError(f"location kind={kind!r} must be 'file', 'http' or 's3'")


def _batches(arrays: list[Any], order: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """``(indices, [values per variable])`` per batch of ``order``, ``BATCHES_AHEAD`` batches read ahead."""
    pending: collections.deque[tuple[np.ndarray, list[Any]]] = collections.deque()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            pending.append((idx, [a[idx].read() for a in arrays]))
            if len(pending) > BATCHES_AHEAD:
                head, futures = pending.popleft()
                yield head, [f.result() for f in futures]
        while pending:
            head, futures = pending.popleft()
            yield head, [f.result() for f in futures]
    finally:  # a pass cut short: drop the reads still in flight
        for _, futures in pending:
            for f in futures:
                f.cancel()


def run_tensorstore(cfg: dict[str, Any]) -> dict[str, Any]:
    """Time the TensorStore loop over ``cfg['location']`` with a cache of ``cfg['cache_bytes']``."""
    import tensorstore as ts

    orders = np.load(cfg["orders_path"])  # (epochs, samples): our train pass's anchors per epoch
    base_rss = rss_bytes()  # before the arrays are opened, as for the other loaders
    started = start()  # a cold pass counts from here: the arrays' open included
    context = ts.Context({"cache_pool": {"total_bytes_limit": int(cfg["cache_bytes"])}})
    arrays = [
        ts.open(
            {"driver": "zarr3", "kvstore": kvstore(cfg["location"], v), "recheck_cached_data": "open"},
            context=context,
            read=True,
        ).result()
        for v in cfg["variables"]
    ]
    batch_size = int(cfg["batch_size"])

    def open_pass(epoch: int) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        return _batches(arrays, orders[epoch % len(orders)], batch_size)

    def close_pass(it: Any) -> None:
        it.close()

    def size(batch: tuple[np.ndarray, list[np.ndarray]]) -> int:
        return len(batch[0])

    window = time_passes(cfg, started, open_pass, size, samples=int(orders.shape[1]), close_pass=close_pass)
    return {
        **window.row(),
        "train_samples": int(orders.shape[1]),
        "train_digest": train_digest(orders[0]),
        "base_rss_mb": base_rss / MB,
        "cache_mb": int(cfg["cache_bytes"]) / MB,
        "cache_is": cfg.get("cache_is", "our budget"),
        "batches_ahead": BATCHES_AHEAD,
    }
