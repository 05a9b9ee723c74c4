"""The raw-GET ceiling: the same GETs a loader issued, at its concurrency, and nothing else.

A loader over a remote store cannot be faster than the store delivers its
bytes. :func:`raw_get_ceiling` measures that bound in the same run as the
loader: it replays a list of keys through the client the engine reads the
store with, ``concurrency`` at a time, and only counts bytes — no decode,
no copy, no Python per sample. The loader's samples/s over the ceiling's samples/s
(the same samples' GETs) is a ratio a throughput gate can pin without an
absolute time, so it holds on a fast laptop and a loaded CI runner alike.

The benchmark report (``bench/``) and the pytest plugin
(:mod:`insitubatch.testing.pytest_plugin`) both measure their ceilings here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .._zarr_compat import sync
from ..stores.reading import reading_store

__all__ = ["GetCeiling", "raw_get_ceiling"]


@dataclass(frozen=True)
class GetCeiling:
    """What one replay of ``gets`` GETs (``nbytes`` body bytes) took, ``concurrency`` at a time."""

    gets: int
    nbytes: int
    seconds: float
    concurrency: int

    @property
    def gets_per_s(self) -> float:
        return self.gets / self.seconds if self.seconds > 0 else float("inf")

    def samples_per_s(self, samples: int) -> float:
        """The rate at which these GETs deliver ``samples`` samples (the ones they hold)."""
        return samples / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gets_per_s": self.gets_per_s}


async def _replay(
    fetch: Callable[[str], Awaitable[int]], keys: Sequence[str], concurrency: int, deadline: float | None
) -> tuple[int, int]:
    """``fetch`` every key (it returns the body's size), ``concurrency`` at a time; ``(GETs done, bytes)``."""
    semaphore = asyncio.Semaphore(concurrency)
    done = nbytes = 0

    async def one(key: str) -> None:
        nonlocal done, nbytes
        async with semaphore:
            if deadline is not None and time.perf_counter() > deadline:
                return
            size = await fetch(key)  # awaited first: `nbytes += await ...` loses updates
            nbytes += size
            done += 1

    await asyncio.gather(*(one(k) for k in keys))
    return done, nbytes


def raw_get_ceiling(store: Any, keys: Sequence[str], concurrency: int, *, window_s: float | None = None) -> GetCeiling:
    """GET every key in ``keys`` (repeats included), ``concurrency`` at a time; return what it took.

    ``store`` is any zarr ``Store``, read through the reader the engine
    reads it with (``stores.reading``: the engine's own HTTP client where it
    takes the store, obstore's otherwise, or the store's own ``get``), on
    zarr's loop; keys are relative to it. With ``window_s`` the replay
    stops starting GETs after that many seconds (a time-boxed sweep), and
    ``gets`` counts those that ran.

    Raises
    ------
    ValueError
        ``concurrency`` below 1 or no keys.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"{concurrency=} must be an int >= 1")
    if not keys:
        raise ValueError("keys is empty: there is nothing to replay")
    t0 = time.perf_counter()
    deadline = None if window_s is None else t0 + window_s
    reading = reading_store(store)  # (a store insitubatch did not build: adapted here, and closed below)
    backend = reading.reader().backend  # what the engine reads the store with, on the loop the engine uses

    async def get(key: str) -> int:
        data = await backend.request(key)
        return 0 if data is None else len(data)

    try:
        done, nbytes = sync(_replay(get, keys, concurrency, deadline))
    finally:
        if reading is not store:
            reading.close()
    return GetCeiling(done, nbytes, time.perf_counter() - t0, concurrency)
