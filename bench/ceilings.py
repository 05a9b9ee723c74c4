"""The two ceilings a loader is held to: decoding the split's tiles from memory on every core, and the raw GETs alone.

Neither assembles a sample: each is the bound one resource (the CPU, the
store's link) puts on any loader of the same data, measured in the same run.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .measure import cpu_s
from .rows import MB
from .split_tiles import geometries, open_store, sample_nbytes, tile_keys, train_indices

__all__ = ["run_decode_ceiling", "run_get_ceiling"]

# The decode ceiling repeats the split's decode at least this often and this
# long, and keeps the best round (a 2-core box is noisy).
CEILING_MIN_ROUNDS = 3
CEILING_MIN_S = 1.0


def run_decode_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """Decode the split's stored chunks from memory on every core: the CPU's bound on the loader."""
    from insitubatch.io.decode import make_decoder

    store = open_store(cfg["local_path"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    root = Path(cfg["local_path"])
    tiles = [(make_decoder(g), coord, (root / key).read_bytes()) for g, coord, key in tile_keys(geoms, train)]
    threads = int(cfg.get("threads") or os.cpu_count() or 1)
    rates = []
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="bench-decode") as pool:
        list(pool.map(lambda t: t[0](t[2], t[1]), tiles[:threads]))  # warm the decoders
        t_start = time.perf_counter()
        while len(rates) < CEILING_MIN_ROUNDS or time.perf_counter() - t_start < CEILING_MIN_S:
            t0 = time.perf_counter()
            list(pool.map(lambda t: t[0](t[2], t[1]), tiles))
            rates.append(len(train) / (time.perf_counter() - t0))
    best = max(rates)  # a ceiling: the best the cores did, not their average
    return {
        "name": cfg["name"],
        "loader": "decode_ceiling",
        "threads": threads,
        "tiles": len(tiles),
        "rounds": len(rates),
        "samples": len(train) * len(rates),
        "elapsed_s": time.perf_counter() - t_start,
        "rate_samples_per_s": best,
        "mean_samples_per_s": float(np.mean(rates)),
        "rate_basis": "decode only, best round",
        "mb_per_s": best * sample_nbytes(geoms) / MB,
        "encoded_mb": sum(len(t[2]) for t in tiles) / MB,
    }


def run_get_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """GET the split's stored chunks ``concurrency`` at a time through the loader's own client, bytes only.

    The replay is :func:`insitubatch.testing.ceiling.raw_get_ceiling`, the one
    the pytest plugin's ``loader_benchmark`` measures its ceiling with.
    """
    from insitubatch.testing.ceiling import raw_get_ceiling

    store = open_store(cfg["url"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    keys = [key for _, _, key in tile_keys(geoms, train)]
    cpu0 = cpu_s()
    ceiling = raw_get_ceiling(store, keys, int(cfg["concurrency"]), window_s=float(cfg["window_s"]))
    cpu = cpu_s() - cpu0
    samples = len(train) * ceiling.gets / len(keys)
    return {
        "name": cfg["name"],
        "loader": "get_ceiling",
        "concurrency": ceiling.concurrency,
        "gets_done": ceiling.gets,
        "samples": samples,
        "elapsed_s": ceiling.seconds,
        "rate_samples_per_s": samples / ceiling.seconds,
        "rate_basis": "GETs only",
        # the client's CPU for the GETs alone (no decode): the floor under any loader's CPU per sample
        "cpu_us_per_sample": 1e6 * cpu / max(samples, 1),
        "gets_per_s": ceiling.gets_per_s,
        "wire_mb_per_s": ceiling.nbytes / ceiling.seconds / MB,
        "mb_per_s": samples * sample_nbytes(geoms) / ceiling.seconds / MB,
    }
