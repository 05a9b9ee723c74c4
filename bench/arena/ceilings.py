"""The two ceilings our loader is held to in the arena: the raw GETs alone, and numcodecs decoding alone.

``get_ceiling``
    :func:`insitubatch.testing.ceiling.raw_get_ceiling` of the train
    split's stored chunks (the keys our pass reads) through the same store
    and client, at the reads-in-flight our timed passes reached: what the
    link can deliver, whatever a loader does with the bytes.
``decode_ceiling``
    numcodecs' own decode of the same tiles, the compressed bytes read
    into memory first (no I/O), on as many threads as our decode pool: what
    the CPU can decode, whatever a loader does around it.

Both run in a child of our virtual environment and report samples/s: the
samples the GETs or decoded tiles hold, per second.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..ceilings import CEILING_MIN_ROUNDS, CEILING_MIN_S
from ..split_tiles import geometries, tile_keys, train_indices
from .harness import MB, cpu_s
from .ours import open_our_store

__all__ = ["numcodecs_decoder", "run_decode_ceiling", "run_get_ceiling"]

# The decode ceiling reads at most this many compressed bytes into memory (whole train chunks, in order):
# about 500 samples of the full arena's data, enough for rounds of a second and more on two cores.
DECODE_CEILING_MAX_BYTES = 256 * 2**20
# zarr v3's blosc shuffle names, as numcodecs numbers them
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def run_get_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """GET the train split's tiles ``concurrency`` at a time for ``window_s``, bytes only; samples/s they hold."""
    from insitubatch.testing.ceiling import raw_get_ceiling

    store = open_our_store(cfg["location"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    keys = [key for _, _, key in tile_keys(geoms, train)]
    cpu0 = cpu_s()
    ceiling = raw_get_ceiling(store, keys, int(cfg["concurrency"]), window_s=float(cfg["window_s"]))
    cpu = cpu_s() - cpu0
    samples = len(train) * ceiling.gets / len(keys)
    return {
        "concurrency": ceiling.concurrency,
        "gets_done": ceiling.gets,
        "samples": samples,
        "seconds": ceiling.seconds,
        "rate_samples_per_s": samples / ceiling.seconds,
        "cpu_s_per_sample": cpu / samples if samples else None,
        "wire_mb_per_s": ceiling.nbytes / ceiling.seconds / MB,
    }


def numcodecs_decoder(array_dir: Path) -> Any:
    """The numcodecs codec that decodes one stored chunk of the zarr v3 array at ``array_dir``.

    Only ``bytes`` (little-endian) followed by one ``blosc`` or ``zstd``
    compressor: the arena's layout. Raises ``ValueError`` naming the
    array's codecs otherwise.
    """
    import numcodecs

    codecs = json.loads((array_dir / "zarr.json").read_text())["codecs"]
    names = [c["name"] for c in codecs]
    little = codecs[0].get("configuration", {}).get("endian", "little") == "little"
    if len(codecs) != 2 or names[0] != "bytes" or not little or names[1] not in ("blosc", "zstd"):
        raise ValueError(f"array {array_dir.name!r} has codecs {names}; the decode ceiling knows bytes + blosc|zstd")
    conf = codecs[1].get("configuration", {})
    if names[1] == "zstd":
        return numcodecs.Zstd(level=int(conf.get("level", 0)))
    return numcodecs.Blosc(
        cname=conf.get("cname", "zstd"),
        clevel=int(conf.get("clevel", 5)),
        shuffle=_BLOSC_SHUFFLE[conf.get("shuffle", "shuffle")],
        blocksize=int(conf.get("blocksize", 0)),
    )


def run_decode_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """Decode whole train chunks' tiles from memory on ``threads`` threads; the best round's samples/s."""
    root = Path(cfg["location"]["path"])
    store = open_our_store(cfg["location"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    spc = next(iter(geoms.values())).sample_chunk_size
    decoders = {name: numcodecs_decoder(root / g.path) for name, g in geoms.items()}
    tiles: list[tuple[Any, bytes]] = []
    nbytes = samples = 0
    for chunk in np.unique(train // spc).tolist():  # whole chunks: every variable's every tile
        if nbytes >= DECODE_CEILING_MAX_BYTES:
            break
        for name, g in geoms.items():
            for t in range(g.tiles_per_chunk):
                data = (root / g.chunk_key(g.physical_chunk_coord(int(chunk), t))).read_bytes()
                tiles.append((decoders[name], data))
                nbytes += len(data)
        samples += int(np.count_nonzero(train // spc == chunk))
    threads = int(cfg["threads"])

    def decode(tile: tuple[Any, bytes]) -> int:
        return len(np.frombuffer(tile[0].decode(tile[1]), dtype="<f4"))  # the bytes codec: a view, no copy

    rates: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="arena-decode") as pool:
        list(pool.map(decode, tiles[:threads]))  # warm each thread's codec state
        t_start = time.perf_counter()
        while len(rates) < CEILING_MIN_ROUNDS or time.perf_counter() - t_start < CEILING_MIN_S:
            t0 = time.perf_counter()
            list(pool.map(decode, tiles))
            rates.append(samples / (time.perf_counter() - t0))
    return {
        "threads": threads,
        "tiles": len(tiles),
        "samples": samples,
        "encoded_mb": nbytes / MB,
        "rounds": len(rates),
        "rate_samples_per_s": max(rates),  # a ceiling: the best the cores did
        "mean_samples_per_s": float(np.mean(rates)),
    }
