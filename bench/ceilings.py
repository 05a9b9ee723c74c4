"""The two ceilings a loader is held to, for the report and the arena alike: the raw GETs alone, and decoding alone.

``get_ceiling``
    :func:`insitubatch.testing.ceiling.raw_get_ceiling` (the replay the
    pytest plugin's ``loader_benchmark`` measures its ceiling with) of the
    train split's stored chunks through the loader's own store and client,
    ``concurrency`` at a time: what the link delivers, whatever a loader
    does with the bytes.
``decode_ceiling``
    The same tiles, their compressed bytes read from disk into memory first
    (no I/O), decoded on ``threads`` threads (every core by default): what
    the CPU decodes, whatever a loader does around it. ``decoder`` picks
    whose decode: ``"insitu"`` (``insitubatch.io.decode.make_decoder``, the
    report's) or ``"numcodecs"`` (numcodecs' own codec, the arena's, which
    holds our loader to a decoder it does not share).

Neither assembles a sample: each is the bound one resource (the store's
link, the CPU) puts on any loader of the same data, measured in the same run
and reported in samples/s (the samples the GETs or decoded tiles hold).
Both take a child's config (:mod:`bench.child`) whose ``location`` says
where the data is (:func:`bench.split_tiles.open_location`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .measure import cpu_s
from .rows import MB
from .split_tiles import geometries, open_location, sample_nbytes, tile_keys, train_indices

__all__ = ["DECODERS", "numcodecs_decoder", "run_decode_ceiling", "run_get_ceiling"]

# The decode ceiling repeats the split's decode at least this often and this
# long, and keeps the best round (a 2-core box is noisy).
CEILING_MIN_ROUNDS = 3
CEILING_MIN_S = 1.0
# The decode ceiling reads at most this many compressed bytes into memory (whole train chunks, in order):
# about 500 samples of the arena's full data, enough for rounds of a second and more on two cores; the
# report's datasets fit whole.
DECODE_CEILING_MAX_BYTES = 256 * 2**20
# Whose decode the decode ceiling times (the config's "decoder"; the first is the default).
DECODERS = ("insitu", "numcodecs")
# zarr v3's blosc shuffle names, as numcodecs numbers them
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}

# One stored chunk to decode: (decode(data, coord), its compressed bytes, its chunk coordinate).
_Tile = tuple[Callable[[bytes, tuple[int, ...]], Any], bytes, tuple[int, ...]]


def run_get_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """GET the train split's stored chunks ``concurrency`` at a time for ``window_s``, bytes only; samples/s they hold."""
    from insitubatch.testing.ceiling import raw_get_ceiling

    store = open_location(cfg["location"])
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
        "elapsed_s": ceiling.seconds,
        "rate_samples_per_s": samples / ceiling.seconds,
        "rate_basis": "GETs only",
        # the client's CPU for the GETs alone (no decode): the floor under any loader's CPU per sample,
        # in the arena's unit (s) and the report's (us)
        "cpu_s_per_sample": cpu / samples if samples else None,
        "cpu_us_per_sample": 1e6 * cpu / max(samples, 1),
        "gets_per_s": ceiling.gets_per_s,
        "wire_mb_per_s": ceiling.nbytes / ceiling.seconds / MB,
        "mb_per_s": samples * sample_nbytes(geoms) / ceiling.seconds / MB,
    }


def run_decode_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """Decode whole train chunks' tiles from memory on ``threads`` threads; the best round's samples/s."""
    decoder = cfg.get("decoder", DECODERS[0])
    if decoder not in DECODERS:
        raise ValueError(f"decoder={decoder!r} must be one of {DECODERS}")
    root = Path(cfg["location"]["path"])
    geoms = geometries(open_location({"kind": "file", "path": str(root)}), cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    tiles, samples = _chunks_in_memory(root, geoms, train, decoder)
    threads = int(cfg.get("threads") or os.cpu_count() or 1)
    rates: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="bench-decode") as pool:
        list(pool.map(_decode, tiles[:threads]))  # warm each thread's codec state
        t_start = time.perf_counter()
        while len(rates) < CEILING_MIN_ROUNDS or time.perf_counter() - t_start < CEILING_MIN_S:
            t0 = time.perf_counter()
            list(pool.map(_decode, tiles))
            rates.append(samples / (time.perf_counter() - t0))
    best = max(rates)  # a ceiling: the best the cores did, not their average
    return {
        "decoder": decoder,
        "threads": threads,
        "tiles": len(tiles),
        "rounds": len(rates),
        "samples_per_round": samples,
        "samples": samples * len(rates),
        "elapsed_s": time.perf_counter() - t_start,
        "rate_samples_per_s": best,
        "mean_samples_per_s": float(np.mean(rates)),
        "rate_basis": "decode only, best round",
        "mb_per_s": best * sample_nbytes(geoms) / MB,
        "encoded_mb": sum(len(t[1]) for t in tiles) / MB,
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


def _chunks_in_memory(root: Path, geoms: dict[str, Any], train: np.ndarray, decoder: str) -> tuple[list[_Tile], int]:
    """Every tile of whole train chunks, in order, read into memory up to ``DECODE_CEILING_MAX_BYTES``; and their samples."""
    decode = {name: _decode_fn(root, g, decoder) for name, g in geoms.items()}
    spc = next(iter(geoms.values())).sample_chunk_size
    tiles: list[_Tile] = []
    nbytes = samples = 0
    for chunk in np.unique(train // spc).tolist():
        if nbytes >= DECODE_CEILING_MAX_BYTES:
            break
        for name, g in geoms.items():  # the whole chunk: every variable's every tile
            for t in range(g.tiles_per_chunk):
                coord = g.physical_chunk_coord(int(chunk), t)
                data = (root / g.chunk_key(coord)).read_bytes()
                tiles.append((decode[name], data, coord))
                nbytes += len(data)
        samples += int(np.count_nonzero(train // spc == chunk))
    return tiles, samples


def _decode_fn(root: Path, geometry: Any, decoder: str) -> Callable[[bytes, tuple[int, ...]], Any]:
    """``decode(data, coord)`` for one array: insitubatch's decoder, or numcodecs' codec then a float32 view."""
    if decoder == "insitu":
        from insitubatch.io.decode import make_decoder

        fn: Callable[[bytes, tuple[int, ...]], Any] = make_decoder(geometry)
        return fn
    codec = numcodecs_decoder(root / geometry.path)
    return lambda data, coord: np.frombuffer(codec.decode(data), dtype="<f4")  # the bytes codec: a view, no copy


def _decode(tile: _Tile) -> Any:
    return tile[0](tile[1], tile[2])
