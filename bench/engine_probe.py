"""The engine against its decode ceiling on a local store, with context switches per tile.

``python -m bench.engine_probe [--n-time N] [--threads 2 4 ...] [--out DIR]``
writes the ERA5-like dataset of the report (``insitubatch.testing.data``), then in this one
process measures, each run a fresh ``InSituDataset`` cold pass over the local
directory (no network, so the engine's own cost is what shows):

* the **decode ceiling** (``bench.ceilings``: the split's stored chunks
  decoded from memory on every core, best round);
* **insitubatch local cold** at each ``decode_threads`` value, with the
  process's voluntary + involuntary context switches (``getrusage``) divided
  by the stored tiles the pass decoded — the per-tile orchestration cost.

Each row also gets the process CPU time per sample. On a shared machine the
wall-clock ratio swings with the neighbours' load (the ceiling keeps its best
round, a pass has one); ``cpu x ceiling`` — the ceiling's CPU per sample over
the pass's, store opening and planning included — is the steadier view of
what the engine itself costs. It prints one table; ratios are to the ceiling
measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
from pathlib import Path
from typing import Any

from insitubatch.testing.data import wb2_64x32, write_era5_like
from insitubatch.testing.emulator import DEFAULT_JITTER_S, EmulatorProcess

from . import child
from .provenance import stamp_line
from .rows import DEFAULT_BANDWIDTH_MB_S, MB, SPLIT_FRACTIONS

__all__ = ["main", "measure"]

# The report's full profile: two years of 6-hourly steps, 8 steps per chunk, batch 32.
DEFAULT_N_TIME = 2920
DEFAULT_SPC = 8
DEFAULT_BATCH = 32


def _usage() -> tuple[int, float]:
    """(context switches, CPU seconds) of every thread of the process, ended ones included."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_nvcsw + ru.ru_nivcsw, ru.ru_utime + ru.ru_stime


def _run(cfg: dict[str, Any]) -> dict[str, Any]:
    switches, cpu = _usage()
    row = child.measure({**cfg, "peak_rss": "tree"})
    after = _usage()
    row["switches"] = after[0] - switches
    row["cpu_s_per_sample"] = (after[1] - cpu) / max(row["samples"], 1)
    return row


def measure(
    path: Path, variables: list[str], *, threads: list[int | None], repeats: int = 1, batch_size: int = DEFAULT_BATCH
) -> list[dict[str, Any]]:
    """Rows for the decode ceiling and one local cold pass per ``decode_threads`` value."""
    common = {
        "local_path": str(path),
        "url": str(path),
        "location": {"kind": "file", "path": str(path)},
        "variables": variables,
        "fractions": list(SPLIT_FRACTIONS),
        "batch_size": batch_size,
        "seed": 0,
        "window_s": float("inf"),
    }
    rows = [_run({**common, "name": "decode-ceiling", "loader": "decode_ceiling"})]
    for n in threads:
        best: dict[str, Any] | None = None
        for _ in range(repeats):
            row = _run({**common, "name": f"insitu-local-t{n or 'default'}", "loader": "insitu", "decode_threads": n})
            row["switches_per_tile"] = row["switches"] / max(row["insitu_gets"], 1)
            if best is None or row["rate_samples_per_s"] > best["rate_samples_per_s"]:
                best = row
        rows.append(best)
    return rows


def measure_remote(
    path: Path,
    variables: list[str],
    *,
    latency_s: float,
    inflight: list[int],
    repeats: int = 1,
    batch_size: int = DEFAULT_BATCH,
) -> list[dict[str, Any]]:
    """insitubatch cold and the raw-GET ceiling at each ``max_inflight``, over the emulated store."""
    rows = []
    with EmulatorProcess(
        path.parent, latency_s=latency_s, jitter_s=DEFAULT_JITTER_S, bandwidth_bytes_per_s=DEFAULT_BANDWIDTH_MB_S * MB
    ) as emu:
        common = {
            "local_path": str(path),
            "url": emu.url_for(path.name),
            "location": {"kind": "http", "url": emu.url_for(path.name), "path": str(path)},
            "variables": variables,
            "fractions": list(SPLIT_FRACTIONS),
            "batch_size": batch_size,
            "seed": 0,
            "window_s": float("inf"),
        }
        for mi in inflight:
            for name, cfg in (
                (f"get-ceiling-c{mi}", {"loader": "get_ceiling", "concurrency": mi}),
                (f"insitu-remote-mi{mi}", {"loader": "insitu", "max_inflight": mi}),
            ):
                runs = [_run({**common, "name": name, **cfg}) for _ in range(repeats)]
                rows.append(max(runs, key=lambda r: r["rate_samples_per_s"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--n-time", type=int, default=DEFAULT_N_TIME)
    parser.add_argument("--samples-per-chunk", type=int, default=DEFAULT_SPC)
    parser.add_argument(
        "--threads", type=int, nargs="*", default=[0], help="decode_threads values to run (0: the default)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per value; the best is kept")
    parser.add_argument(
        "--latency-ms", type=float, default=None, help="also measure over the emulated object store with this latency"
    )
    parser.add_argument("--inflight", type=int, nargs="*", default=[32], help="max_inflight values (remote)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "insitubatch-engine-probe")
    args = parser.parse_args(argv)
    spec = wb2_64x32(args.n_time, samples_per_chunk=args.samples_per_chunk)
    path = write_era5_like(args.out / spec.name, spec)
    rows = measure(path, list(spec.variables), threads=[t or None for t in args.threads], repeats=args.repeats)
    ceiling, ceiling_cpu = rows[0]["rate_samples_per_s"], rows[0]["cpu_s_per_sample"]
    print(f"{stamp_line()}; cpus={os.cpu_count()}  dataset={spec.name}  load={os.getloadavg()[0]:.1f}")
    print(f"{'run':<24}{'samples/s':>12}{'x ceiling':>11}{'cpu x ceiling':>15}{'switches/tile':>15}")
    for row in rows:
        rate = row["rate_samples_per_s"]
        sw = row.get("switches_per_tile")
        print(
            f"{row['name']:<24}{rate:>12.0f}{rate / ceiling:>11.2f}{ceiling_cpu / row['cpu_s_per_sample']:>15.2f}"
            f"{'' if sw is None else f'{sw:.1f}':>15}"
        )
    if args.latency_ms is not None:
        rows = measure_remote(
            path, list(spec.variables), latency_s=args.latency_ms / 1e3, inflight=args.inflight, repeats=args.repeats
        )
        print(f"\nemulated store, {args.latency_ms:g} ms latency")
        print(f"{'run':<24}{'samples/s':>12}{'x GETs':>11}{'cpu ms/1k':>11}{'switches/tile':>15}")
        for gets, row in zip(rows[::2], rows[1::2]):
            for r in (gets, row):
                sw = r["switches"] / max(r.get("insitu_gets", 0), 1) if r["loader"] == "insitu" else None
                print(
                    f"{r['name']:<24}{r['rate_samples_per_s']:>12.0f}"
                    f"{r['rate_samples_per_s'] / gets['rate_samples_per_s']:>11.2f}"
                    f"{r['cpu_s_per_sample'] * 1e6:>11.0f}{'' if sw is None else f'{sw:.1f}':>15}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
