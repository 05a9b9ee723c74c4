"""The end-to-end report: insitubatch against its peers on an emulated 30 ms object store.

``python -m bench.run [--quick] [--out DIR]`` writes ERA5-like datasets (one
per samples-per-chunk value), serves them from :class:`insitubatch.testing.emulator.EmulatorProcess`,
and measures, one fresh child process per run (``bench.child``), every
loader on the same data in the same run:

* the **loader table** at the main samples-per-chunk value and at one
  sample per chunk: torch DataLoader with per-sample zarr reads over
  ``num_workers`` × start method, xbatcher + DataLoader, plain zarr-python
  (contiguous), insitubatch cold, warm (pool holding the split; persisted
  cache when ``InSituDataset`` takes ``persist``), insitubatch on the local
  directory (network not the limit), and the two ceilings: decode of the
  same chunks from memory on every core, and the raw concurrent GETs;
* the **fork probe**: DataLoader ``fork`` workers after the parent used obstore;
* a **samples-per-chunk sweep** and a **max_inflight sweep**;
* the **network scenarios** of ``bench.network`` (full profile only): a
  heavy-tailed link, stragglers, throttling bursts, CPU per sample over
  HTTP and S3 against local files, silent GETs and dead objects, and the
  sharded copy of the data;
* the **arena** of ``bench.arena`` (full profile only): realistic ERA5-shaped
  fields (181 x 360) over local files, HTTP at 0 and 30 ms, the tailed
  40 ms link, stragglers and S3, with the reference design and TensorStore
  as peers, CPU per sample, peak memory against ``describe()``'s bound,
  the raw-GET and decode ceilings, and one cold pass per loader (TensorStore
  with a cache that holds the split) (``arena.json`` / ``arena.md`` beside
  the report).

It writes ``results.json``, ``report.md`` and PNG plots to ``--out``
(default ``bench/out/``) and prints the table. Throughput ratios use each
run's steady rate (first batch excluded), which favours the worker
baselines; time to first batch is reported on its own. The design targets
(the "bars": throughput against each baseline and ceiling, time to first
batch, warm against cold, GETs, peak RSS) are evaluated and printed as
measured, pass or miss.

Where each part lives: the report, the network scenarios and the arena are
scenario lists over one harness (``bench.scenarios``: a :class:`~bench.scenarios.Scenario`
is a link, :func:`~bench.scenarios.measure_each` serves each in turn): the
report's own link (its flags) measured by ``bench.loader_scenarios``, the
network scenarios' table in ``bench.network`` and the arena's in
``bench.arena.scenarios``, every run through ``bench.children``, the one
child runner, in a child process with ``bench.child``; ``bench.targets`` computes the
ratios and bars, ``bench.report_markdown`` and ``bench.plots`` write them.
The profiles are ``bench.profiles``; what all of them share is ``bench.rows``.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from insitubatch.testing.data import wb2_64x32, write_era5_like
from insitubatch.testing.emulator import DEFAULT_JITTER_S, DEFAULT_LATENCY_S, EmulatorProcess

from .arena.run import DEFAULT_REFERENCE_VENV, run_arena
from .arena.scenarios import FULL as ARENA_FULL
from .children import Bench
from .insitu_loaders import supports_persist
from .loader_scenarios import sections
from .network import NET_FULL, run_scenarios
from .plots import plots
from .profiles import FULL, QUICK, Profile
from .provenance import provenance
from .report_markdown import markdown
from .rows import DEFAULT_BANDWIDTH_MB_S, MB, REPO_ROOT, SPLIT_FRACTIONS, clean
from .scenarios import Scenario, measure_each
from .targets import bars, memory_bar, ratios

__all__ = ["main", "run"]

DEFAULT_OUT = REPO_ROOT / "bench" / "out"


def _insitu_defaults() -> dict[str, Any]:
    """The knobs every insitubatch row runs with: ``InSituDataset``'s own defaults."""
    from insitubatch.dataset import InSituDataset

    params = inspect.signature(InSituDataset).parameters
    return {k: params[k].default for k in ("max_inflight", "block_chunks", "prefetch_depth")}


def _versions() -> dict[str, str]:
    """The versions of Python and of every package a row's numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("insitubatch", "zarr", "obstore", "numpy", "torch", "xarray", "xbatcher", "dask"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _xbatcher_available() -> str | None:
    """Why the xbatcher baseline cannot run here, or ``None`` when it can."""
    missing = [name for name in ("xarray", "xbatcher") if importlib.util.find_spec(name) is None]
    return f"xbatcher baseline skipped: {', '.join(missing)} not installed" if missing else None


def _report_scenario(latency_s: float, jitter_s: float, bandwidth_mb_s: float | None) -> Scenario:
    """The report's own scenario: HTTP at its flags' latency, jitter and per-connection rate (``None``: unpaced)."""
    bandwidth = None if bandwidth_mb_s is None else bandwidth_mb_s * MB
    link = {"latency_s": latency_s, "jitter_s": jitter_s, "bandwidth_bytes_per_s": bandwidth}
    what = f"HTTP at {latency_s * 1e3:g} ms + up to {jitter_s * 1e3:g} ms jitter"
    return Scenario("report", "http", link, what + (f", {bandwidth_mb_s:g} MB/s per connection" if bandwidth else ""))


def run(
    profile: Profile,
    out: Path,
    *,
    latency_s: float,
    jitter_s: float,
    bandwidth_mb_s: float | None,
    plot: bool = True,
    network: bool = True,
    arena: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure everything ``profile`` names; write ``results.json``, ``report.md`` and plots under ``out``."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    data_dir.mkdir(exist_ok=True)
    specs = {
        spc: wb2_64x32(profile.n_time, samples_per_chunk=spc)
        for spc in sorted(set(profile.sweep_spcs) | {profile.main_spc, 1})
    }
    for spec in specs.values():
        t0 = time.perf_counter()
        write_era5_like(data_dir / spec.name, spec)
        log(f"data  {spec.name}  ready in {time.perf_counter() - t0:.1f}s")
    knobs = _insitu_defaults()
    notes = []
    xb_missing = _xbatcher_available()
    xb_grid = () if xb_missing else profile.xbatcher_grid
    if xb_missing:
        notes.append(xb_missing)
    scenario = _report_scenario(latency_s, jitter_s, bandwidth_mb_s)
    dask = profile.xbatcher_dask and not xb_missing

    def every_section(scenario: Scenario, emu: EmulatorProcess | None) -> dict[str, Any]:
        assert emu is not None  # the report's link is remote
        bench = Bench(profile, out, emu, data_dir, specs, knobs, log)
        try:
            return sections(bench, xb_grid, dask=dask)
        finally:
            bench.close()

    found = measure_each([scenario], data_dir, every_section, label="report", log=log)[scenario.name]
    results: dict[str, Any] = {
        "tables": found["tables"],
        "ratios": {},
        "sweeps": found["sweeps"],
        "findings": {"fork": found["fork"], "notes": notes},
        "memory": found["memory"],
    }
    for spc, rows in results["tables"].items():
        results["ratios"][spc] = ratios(rows)
    if network and profile.name == FULL.name:  # the quick smoke run leaves them out (minutes of windows)
        log("network scenarios")
        results["network"] = run_scenarios(out / "network", NET_FULL, log=log)
    if arena and profile.name == FULL.name:
        log("arena: realistic fields, the reference design and TensorStore")
        found = run_arena(ARENA_FULL, out, out / "arena-data", ref_venv=DEFAULT_REFERENCE_VENV, log=log)
        results["arena"] = {"ratios": found["ratios"], "bars": found["bars"], "report": "arena.md"}
    results["bars"] = bars(results["tables"], profile.main_spc, isolated=profile.isolate)
    mem_bar = memory_bar(results.get("memory") or {}, profile.main_spc, isolated=profile.isolate)
    if mem_bar is not None:
        results["bars"].append(mem_bar)
    results["meta"] = {
        "measured": provenance(),
        "profile": profile.name,
        "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *sys.argv[1:]]),
        "elapsed_s": time.perf_counter() - started,
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
        "emulator": {"latency_s": latency_s, "jitter_s": jitter_s, "bandwidth_mb_s": bandwidth_mb_s},
        "batch_size": profile.batch_size,
        "n_time": profile.n_time,
        "main_spc": profile.main_spc,
        "fractions": SPLIT_FRACTIONS,
        "insitu_knobs": knobs,
        "persist_supported": supports_persist(),
        "isolation": "a child process per run" if profile.isolate else "in-process (fork probe in a child)",
        "profile_settings": asdict(profile),
        "datasets": {
            spc: {"name": s.name, "sample_nbytes": s.sample_nbytes, "chunks": s.chunks} for spc, s in specs.items()
        },
    }
    results = clean(results)
    results["plots"] = plots(results, out) if plot else []
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(markdown(results))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small dataset and a few loaders (< 60 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_S * 1e3, help="time to first byte floor")
    parser.add_argument("--jitter-ms", type=float, default=DEFAULT_JITTER_S * 1e3, help="uniform extra delay, up to")
    parser.add_argument(
        "--bandwidth-mb-s", type=float, default=DEFAULT_BANDWIDTH_MB_S, help="per-connection body rate (0: unpaced)"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-network", action="store_true", help="skip the network scenarios (bench.network)")
    parser.add_argument("--no-arena", action="store_true", help="skip the realistic-fields arena (bench.arena)")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    results = run(
        profile,
        args.out.resolve(),
        latency_s=args.latency_ms / 1e3,
        jitter_s=args.jitter_ms / 1e3,
        bandwidth_mb_s=args.bandwidth_mb_s or None,
        plot=not args.no_plots,
        network=not args.no_network,
        arena=not args.no_arena,
    )
    print()
    print(markdown(results))
    print(
        f"wrote {args.out / 'results.json'}, {args.out / 'report.md'}"
        + (f" and {len(results['plots'])} plots" if results["plots"] else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
