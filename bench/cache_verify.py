"""What checksum verification costs a warm persisted epoch, with and without it in one run.

``python -m bench.cache_verify [--data DIR] [--rounds N] [--batch-size B] [--json FILE]``

Writes the demo dataset (``insitubatch.tools.demo``: 2920 six-hourly steps
of 32×64, three variables, zstd, 16-step chunks) unless ``--data`` names
one, fills a persisted cache with one epoch of ``train``, then alternates
warm epochs with verification on (the default) and off
(``DiskCache.verify = False``). Each epoch is a fresh ``InSituDataset``, as a
new run would be, so every tile file it revives is verified: the most a
warm epoch pays (a file is verified once per process). The page cache is
warm for both, so the difference is the CRC-32C itself. Rounds alternate
to share out a noisy machine's drift. The cost is the ratio ``verified /
unverified`` of wall times: the median over back-to-back pairs is the figure
held to the target (at most 1.05), as the steadiest on a shared machine; the
best epoch of each kind and the median of each kind are shown beside it (a
best of a few tens of 40 ms epochs moves by several percent run to run). It
prints one table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.tools.demo import write_demo_dataset

__all__ = ["main", "measure"]

DEFAULT_ROUNDS = 5
DEFAULT_BATCH = 32
# verification may add at most this share to a warm persisted epoch
TARGET_RATIO = 1.05


def _epoch(data: Path, cache: Path, *, verify: bool, batch_size: int) -> dict[str, Any]:
    """One warm epoch of ``train`` in a fresh dataset: wall seconds, samples, GETs and revived chunks."""
    geoms = open_geometries(str(data))
    manifest = split_by_chunk(next(iter(geoms.values())), fractions=(0.8, 0.1, 0.1))
    t0 = time.perf_counter()
    with InSituDataset(str(data), manifest, geoms, batch_size=batch_size, cache_dir=cache, persist=True) as ds:
        assert ds.cache is not None
        ds.cache.verify = verify
        it = iter(ds.train)
        samples = sum(len(batch) for batch in it)
        wall = time.perf_counter() - t0
        c = it.counters
        return {"verify": verify, "wall_s": wall, "samples": samples, "gets": c.gets, "revived": c.revived}


def measure(data: Path, cache: Path, *, rounds: int = DEFAULT_ROUNDS, batch_size: int = DEFAULT_BATCH) -> dict:
    """Fill ``cache`` from ``data``, then ``rounds`` alternating warm epochs of each kind; the best of each."""
    fill = _epoch(data, cache, verify=True, batch_size=batch_size)
    runs: list[dict[str, Any]] = []
    pair_ratios = []
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        pair = {v: _epoch(data, cache, verify=v, batch_size=batch_size) for v in order}
        runs += pair.values()
        pair_ratios.append(pair[True]["wall_s"] / pair[False]["wall_s"])
    best = {v: min((x for x in runs if x["verify"] is v), key=lambda x: x["wall_s"]) for v in (True, False)}
    assert all(x["gets"] == 0 for x in runs), "a warm epoch fetched: the cache was not complete"
    return {
        "fill": fill,
        "runs": runs,
        "verified": best[True],
        "unverified": best[False],
        "ratio": best[True]["wall_s"] / best[False]["wall_s"],
        "median_ratio": statistics.median(x["wall_s"] for x in runs if x["verify"])
        / statistics.median(x["wall_s"] for x in runs if not x["verify"]),
        "median_pair_ratio": statistics.median(pair_ratios),
        "cache_bytes": sum(p.stat().st_size for p in cache.glob("*.npy")),
    }


def _table(result: dict) -> str:
    lines = [
        f"cache: {result['cache_bytes'] / 1e6:.1f} MB of tile files; cold fill {result['fill']['wall_s']:.2f} s",
        "warm persisted epoch     wall s   samples/s   revived   GETs",
    ]
    for name in ("verified", "unverified"):
        row = result[name]
        lines.append(
            f"{name:<22} {row['wall_s']:8.3f} {row['samples'] / row['wall_s']:11.0f} {row['revived']:9d} {row['gets']:6d}"
        )
    pair = result["median_pair_ratio"]
    lines.append(
        f"verified / unverified: {pair:.3f} median of back-to-back pairs (target <= {TARGET_RATIO}: "
        f"{'met' if pair <= TARGET_RATIO else 'NOT met'}); {result['median_ratio']:.3f} median against median, "
        f"{result['ratio']:.3f} best against best"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_verify", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", type=Path, help="a zarr group to read (default: the demo dataset, written to a temp dir)"
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="insitu-verify-") as tmp:
        data = args.data or write_demo_dataset(Path(tmp) / "demo.zarr")
        result = measure(data, Path(tmp) / "cache", rounds=args.rounds, batch_size=args.batch_size)
    print(_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
