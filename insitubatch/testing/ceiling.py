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

from .._wire.engine_client import native_backend

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


def _raw(store: Any) -> Any:
    """The obstore store under a zarr ``ObjectStore`` (or an obstore store given as is), else None."""
    inner = getattr(store, "store", None)
    module = type(inner).__module__ if inner is not None else type(store).__module__
    if inner is not None and module.startswith("obstore"):
        return inner
    return store if module.startswith("obstore") else None


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

    ``store`` is a zarr ``ObjectStore`` (in a private event loop, the
    client the engine reads it with: its own HTTP client where
    ``_wire.engine_client`` takes the store, obstore's otherwise) or any
    zarr ``Store`` (its ``get``, on zarr's loop); keys are relative to it. With ``window_s`` the replay
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
    raw = _raw(store)
    native = None if raw is None else native_backend(raw, raw)
    if native is not None:  # the engine sends these GETs itself: the ceiling is its client's

        async def get_native(key: str) -> int:
            return len(await native.request(key))

        done, nbytes = asyncio.run(_replay(get_native, keys, concurrency, deadline))
    elif raw is not None:
        import obstore

        async def get_raw(key: str) -> int:
            result = await obstore.get_async(raw, key)
            return len(await result.bytes_async())

        done, nbytes = asyncio.run(_replay(get_raw, keys, concurrency, deadline))
    else:
        from zarr.core.buffer import default_buffer_prototype

        from .._zarr_compat import sync

        prototype = default_buffer_prototype()

        async def get_zarr(key: str) -> int:
            buf = await store.get(key, prototype)
            return 0 if buf is None else len(buf)

        done, nbytes = sync(_replay(get_zarr, keys, concurrency, deadline))
    return GetCeiling(done, nbytes, time.perf_counter() - t0, concurrency)
