"""The end-to-end report: insitubatch against its peers on an emulated 30 ms object store.

``python -m bench.run [--quick] [--out DIR]`` writes ERA5-like datasets (one
per samples-per-chunk value), serves them from :class:`insitubatch.testing.emulator.EmulatorProcess`,
and measures, one fresh child process per run (``bench.baselines``), every
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
  sharded copy of the data.

It writes ``results.json``, ``report.md`` and PNG plots to ``--out``
(default ``bench/out/``) and prints the table. Throughput ratios use each
run's steady rate (first batch excluded), which favours the worker
baselines; time to first batch is reported on its own. The design targets
(the "bars": throughput against each baseline and ceiling, time to first
batch, warm against cold, GETs, peak RSS) are evaluated and printed as
measured, pass or miss.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from insitubatch.progress import progress
from insitubatch.testing.data import DatasetSpec, wb2_64x32, write_era5_like
from insitubatch.testing.emulator import DEFAULT_JITTER_S, DEFAULT_LATENCY_S, EmulatorProcess

from .baselines import RESULT_PREFIX, data_key_predicate, run_config, supports_persist
from .provenance import provenance, stamp_line

__all__ = ["FULL", "QUICK", "Profile", "main"]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "bench" / "out"
MB = 1e6
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
# A single object-store stream moves on the order of 100 MB/s.
DEFAULT_BANDWIDTH_MB_S = 100.0
# The RSS target's allowance for the interpreter and its libraries (peak RSS <= budget + queue +
# in flight + this).
RSS_ALLOWANCE_MB = 300.0
# The memory pass reads a split at least this many times the pool budget, so
# memory held past eviction would show; block_chunks is lowered until the split is that large.
MEMORY_SPLIT_OVER_BUDGET = 8
# the working set spans about this many shuffle blocks (the gathered ones and the read-ahead)
WORKING_SET_BLOCKS = 3
# What a child imports before its clock starts, per loader (a training script's imports).
_PRELOAD = {
    "dataloader": ["torch", "zarr", "insitubatch.io.stores"],
    "fork_probe": ["torch", "zarr", "insitubatch.io.stores"],
    "xbatcher": ["torch", "xarray", "xbatcher", "insitubatch.io.stores"],
    "zarr": ["zarr", "insitubatch.io.stores"],
    "insitu": ["insitubatch.dataset"],
    "insitu_warm": ["insitubatch.dataset"],
    "insitu_persist": ["insitubatch.dataset"],
    "insitu_steady": ["insitubatch.dataset"],
    "decode_ceiling": ["insitubatch.io.decode"],
    "get_ceiling": ["obstore", "insitubatch.io.stores"],
}
WORKER_LOADERS = ("dataloader", "xbatcher")
FORK_PROBE_BATCH = 4
BASELINE_LOADERS = ("dataloader", "xbatcher", "zarr")
# the raw-GET ceiling's concurrency when an "auto" run did not say what it chose (the engine's old default)
AUTO_FALLBACK_CONCURRENCY = 32


@dataclass(frozen=True)
class Profile:
    """How much the report measures; :data:`FULL` fits ~10 min on 2 cores, :data:`QUICK` < 60 s."""

    name: str
    n_time: int
    batch_size: int
    main_spc: int
    sweep_spcs: tuple[int, ...]
    # the worker baselines read one sample per __getitem__, so their rate is
    # flat in samples-per-chunk; they are swept at these values only
    worker_sweep_spcs: tuple[int, ...]
    # the whole loader grid runs at main_spc; at one sample per chunk only the best of each kind
    dataloader_grid: tuple[tuple[int, str | None], ...]
    xbatcher_grid: tuple[tuple[int, str | None], ...]
    xbatcher_dask: bool
    inflight: tuple[int, ...]
    window_s: float
    sweep_window_s: float
    fork_timeout_s: float
    fork_variants: tuple[str, ...]
    child_timeout_s: float
    # True: each run in a fresh child process (clean RSS and TTFB); False: in
    # this process, imports paid once (the quick smoke run; the fork probe is
    # always a child)
    isolate: bool
    # at one sample per chunk, also the warm and local-store insitubatch rows
    warm_and_local_at_1: bool
    # the main table runs insitubatch and the ceilings this often and keeps the median (noisy small boxes)
    repeats: int


FULL = Profile(
    name="full",
    n_time=2920,  # two years of 6-hourly steps
    batch_size=32,
    main_spc=8,
    sweep_spcs=(1, 2, 4, 8, 16, 32),
    worker_sweep_spcs=(1, 8, 32),
    dataloader_grid=((0, None), (2, "spawn"), (2, "forkserver"), (4, "spawn"), (4, "forkserver")),
    xbatcher_grid=((0, None), (2, "spawn")),
    xbatcher_dask=True,
    inflight=(1, 2, 4, 8, 16, 32, 64, 128),
    window_s=3.0,
    sweep_window_s=2.0,
    fork_timeout_s=8.0,
    fork_variants=("inherit", "reopen", "clean"),
    child_timeout_s=240.0,
    isolate=True,
    warm_and_local_at_1=False,
    repeats=3,
)
QUICK = Profile(
    name="quick",
    n_time=192,
    batch_size=8,
    main_spc=8,
    sweep_spcs=(1, 8),
    worker_sweep_spcs=(1, 8),
    dataloader_grid=((0, None),),
    xbatcher_grid=((0, None),),
    xbatcher_dask=False,
    inflight=(4, 32),
    window_s=0.5,
    sweep_window_s=0.5,
    fork_timeout_s=4.0,
    fork_variants=("inherit",),
    child_timeout_s=60.0,
    isolate=False,
    warm_and_local_at_1=False,
    repeats=1,
)


def _workers_name(kind: str, workers: int, method: str | None) -> str:
    return f"{kind}-{workers}" if workers == 0 else f"{kind}-{method}-{workers}"


class Bench:
    """Runs children against one emulator and collects their rows."""

    def __init__(
        self,
        profile: Profile,
        out: Path,
        emu: EmulatorProcess,
        data_dir: Path,
        specs: dict[int, DatasetSpec],
        insitu_knobs: dict[str, Any],
        log: Callable[[str], None],
    ) -> None:
        self.profile = profile
        self.out = out
        self.emu = emu
        self.data_dir = data_dir
        self.specs = specs
        self.insitu_knobs = insitu_knobs
        self.log = log
        self.child_log = (out / "children.log").open("w")
        self.bar = progress(desc="bench", unit="run")  # measurements finished (silent off a terminal)

    def close(self) -> None:
        self.bar.close()
        self.child_log.close()

    # -- one child ---------------------------------------------------------------------------
    def run(self, spc: int, name: str, loader: str, *, repeats: int = 1, **cfg: Any) -> dict[str, Any]:
        """Run one measurement ``repeats`` times; the row with the median rate, all rates in ``repeat_rates``."""
        rows = [self._run_once(spc, name, loader, **cfg) for _ in range(repeats)]
        self.bar.update(repeats)
        if repeats == 1:
            return rows[0]
        good = sorted((r for r in rows if not r.get("error")), key=_rate)
        if not good:
            return rows[0]
        row = good[len(good) // 2]
        row["repeat_rates"] = [_rate(r) for r in rows]
        return row

    def _run_once(self, spc: int, name: str, loader: str, **cfg: Any) -> dict[str, Any]:
        """Run one measurement in a child; add the emulator's counters; never raise."""
        spec = self.specs[spc]
        config = {
            "name": name,
            "loader": loader,
            "url": self.emu.url_for(spec.name),
            "local_path": str(self.data_dir / spec.name),
            "variables": list(spec.variables),
            "fractions": list(SPLIT_FRACTIONS),
            "batch_size": self.profile.batch_size,
            "window_s": self.profile.window_s,
            "seed": 0,
            "preload": _PRELOAD[loader],
            "emulator_reset_url": f"{self.emu.url}/_emulator/reset",
            "rss_exclude_pids": [self.emu.pid],
            **cfg,
        }
        timeout = self.profile.child_timeout_s
        self.emu.reset_stats()
        t0 = time.perf_counter()
        row = self._spawn(config, timeout)
        stats = self.emu.stats()
        is_data = data_key_predicate(spec.name, spec.variables)
        row.update(
            spc=spc,
            name=name,
            loader=loader,
            wall_s=time.perf_counter() - t0,
            gets=stats.gets_where(is_data),
            metadata_gets=stats.gets - stats.gets_where(is_data),
            wire_mb=stats.bytes_where(is_data) / MB,
            config={
                k: v
                for k, v in config.items()
                if k not in ("url", "local_path", "variables", "preload", "emulator_reset_url", "rss_exclude_pids")
            },
        )
        if row.get("min_gets"):
            row["gets_ratio"] = row["gets"] / row["min_gets"]
        if row.get("elapsed_s"):
            row["wire_mb_per_s"] = row["wire_mb"] / row["elapsed_s"]
        self.log(_one_line(row))
        return row

    def _spawn(self, config: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self.profile.isolate and config["loader"] != "fork_probe":
            return _in_process(config)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-c", "from bench.baselines import main; main()", json.dumps(config)]
        self.child_log.write(f"\n=== {config['name']} ({config['url']})\n")
        self.child_log.flush()
        # its own session, so a timeout can end the child and its workers together
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.child_log,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"error": f"timed out after {timeout:.0f}s"}
        for line in reversed(stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX) :])
        return {"error": f"child exited {proc.returncode} without a result (see children.log)"}

    # -- groups of runs --------------------------------------------------------------------------
    def insitu(self, spc: int, name: str, *, repeats: int = 1, **extra: Any) -> dict[str, Any]:
        return self.run(spc, name, "insitu", repeats=repeats, **{**self.insitu_knobs, "window_s": math.inf, **extra})

    def memory_pass(self, spc: int, spec: DatasetSpec) -> dict[str, Any]:
        """A cold pass whose split is >= ``MEMORY_SPLIT_OVER_BUDGET`` × the automatic budget, with inspect's bound."""
        train_chunks = int(spec.n_time * SPLIT_FRACTIONS[0]) // spec.samples_per_chunk
        block_chunks = max(
            1,
            min(
                self.insitu_knobs.get("block_chunks") or train_chunks,
                train_chunks // (MEMORY_SPLIT_OVER_BUDGET * WORKING_SET_BLOCKS),
            ),
        )
        return self.insitu(spc, "insitu-memory", block_chunks=block_chunks, memory_probe=True)

    def table(
        self,
        spc: int,
        dataloader_grid: Sequence[tuple[int, str | None]],
        xbatcher_grid: Sequence[tuple[int, str | None]],
        *,
        dask: bool,
        warm_and_local: bool = True,
        repeats: int = 1,
    ) -> list[dict[str, Any]]:
        """Every loader at ``spc`` samples per chunk; insitubatch and the ceilings ``repeats`` times (median)."""
        rows = []
        for workers, method in dataloader_grid:
            rows.append(
                self.run(
                    spc,
                    _workers_name("dataloader", workers, method),
                    "dataloader",
                    num_workers=workers,
                    start_method=method,
                )
            )
        for workers, method in xbatcher_grid:
            rows.append(
                self.run(
                    spc,
                    _workers_name("xbatcher", workers, method),
                    "xbatcher",
                    num_workers=workers,
                    start_method=method,
                )
            )
        if dask:
            rows.append(self.run(spc, "xbatcher-dask-0", "xbatcher", num_workers=0, xarray_chunks={}))
        rows.append(self.run(spc, "zarr-contiguous", "zarr"))
        cold = self.insitu(spc, "insitu-cold", repeats=repeats)
        rows.append(cold)
        if warm_and_local:
            rows.extend(self._warm_and_local(spc, repeats))
        rows.append(self.run(spc, "decode-ceiling", "decode_ceiling", repeats=repeats))
        rows.append(
            self.run(
                spc,
                "get-ceiling",
                "get_ceiling",
                concurrency=ceiling_concurrency(self.insitu_knobs["max_inflight"], cold),
                window_s=math.inf,
                repeats=repeats,
            )
        )
        return rows

    def _warm_and_local(self, spc: int, repeats: int) -> list[dict[str, Any]]:
        rows = [self.run(spc, "insitu-warm-memory", "insitu_warm", **self.insitu_knobs, window_s=math.inf)]
        if supports_persist():
            cache_dir = self.out / "cache" / self.specs[spc].name
            shutil.rmtree(cache_dir, ignore_errors=True)
            common = {**self.insitu_knobs, "window_s": math.inf, "cache_dir": str(cache_dir)}
            rows.append(self.run(spc, "insitu-persist-fill", "insitu_persist", phase="fill", **common))
            rows.append(self.run(spc, "insitu-warm-persisted", "insitu_persist", phase="warm", **common))
        rows.append(self.insitu(spc, "insitu-local", url=str(self.data_dir / self.specs[spc].name), repeats=repeats))
        return rows

    def fork_probes(self, spc: int) -> list[dict[str, Any]]:
        n = self.specs[spc].n_time
        # a small batch: a worker that is not stuck delivers it well inside the timeout
        return [
            self.run(
                spc,
                f"fork-{variant}",
                "fork_probe",
                variant=variant,
                n_samples=n,
                timeout_s=self.profile.fork_timeout_s,
                batch_size=FORK_PROBE_BATCH,
            )
            for variant in self.profile.fork_variants
        ]


def _read_once_bar(cold: dict[str, Any], spc: int) -> dict[str, Any]:
    """Read once: the engine read each tile once, and the server's data GETs are those reads plus at most
    the hedged duplicates (a second GET of a late tile; one cancelled before it went out never arrives)."""
    hedged = cold.get("hedged") or 0
    gets, need = cold.get("gets", math.nan), cold.get("min_gets", math.nan)
    reads = cold.get("insitu_gets", need)
    return {
        "bar": "GETs per epoch == distinct stored tiles (+ hedged duplicates)",
        "spc": spc,
        "measured": gets,
        "target": need,
        "passed": bool(reads == need and need <= gets <= need + hedged) if cold else None,
        "note": f"the engine read {reads} tiles; the server saw {gets - need} of {hedged} hedged duplicate(s)"
        if hedged
        else "",
    }


def ceiling_concurrency(max_inflight: Any, insitu_row: dict[str, Any]) -> int:
    """The raw-GET ceiling's concurrency: insitubatch's pinned ``max_inflight``, or the limit "auto" chose."""
    if max_inflight != "auto":
        return int(max_inflight)
    return int(insitu_row.get("inflight_median") or AUTO_FALLBACK_CONCURRENCY)


def _in_process(config: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process (``Profile.isolate`` False)."""
    try:
        for module in config["preload"]:
            __import__(module)
        return run_config(config)
    except Exception as exc:  # a failed loader is a row, not the end of the report
        return {"error": f"{type(exc).__name__}: {exc}"}


# -- evaluation ------------------------------------------------------------------------------------
def _rate(row: dict[str, Any] | None) -> float:
    """The rate a row is compared by (``rate_samples_per_s``); NaN for a failed or missing row."""
    if not row or row.get("error"):
        return math.nan
    value = row.get("rate_samples_per_s")
    return float(value) if value is not None else math.nan


def _best(rows: Sequence[dict[str, Any]], loaders: Sequence[str]) -> dict[str, Any] | None:
    candidates = [r for r in rows if r["loader"] in loaders and not math.isnan(_rate(r))]
    return max(candidates, key=_rate) if candidates else None


def _by_name(rows: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["name"] == name), None)


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """insitubatch cold (its pass rate) over every baseline (steady rate) and ceiling in one table."""
    cold = _by_name(rows, "insitu-cold")
    base = _rate(cold)
    out: dict[str, Any] = {"insitu_over": {}}
    for r in rows:
        if r["loader"] in BASELINE_LOADERS or r["loader"].endswith("ceiling"):
            out["insitu_over"][r["name"]] = _ratio(base, _rate(r))
    best_dl, best_worker, best_any = (_best(rows, k) for k in (("dataloader",), WORKER_LOADERS, BASELINE_LOADERS))
    out["best_dataloader"] = best_dl and best_dl["name"]
    out["best_worker_baseline"] = best_worker and best_worker["name"]
    out["best_baseline"] = best_any and best_any["name"]
    out["over_best_dataloader"] = _ratio(base, _rate(best_dl))
    out["over_best_worker_baseline"] = _ratio(base, _rate(best_worker))
    out["over_best_baseline"] = _ratio(base, _rate(best_any))
    decode, gets, local = (_by_name(rows, n) for n in ("decode-ceiling", "get-ceiling", "insitu-local"))
    out["fraction_of_decode_ceiling"] = _ratio(base, _rate(decode))
    out["fraction_of_get_ceiling"] = _ratio(base, _rate(gets))
    out["local_fraction_of_decode_ceiling"] = _ratio(_rate(local), _rate(decode))
    ceilings = [c for c in (decode, gets) if c is not None and not math.isnan(_rate(c))]
    binding = min(ceilings, key=_rate) if ceilings else None
    out["binding_ceiling"] = binding and binding["name"]
    out["fraction_of_binding_ceiling"] = _ratio(base, _rate(binding))
    ttfb = (cold or {}).get("ttfb_s", math.nan)
    out["ttfb_speedup"] = {
        r["name"]: _ratio(r.get("ttfb_s", math.nan), ttfb)
        for r in rows
        if r["loader"] in WORKER_LOADERS and r.get("config", {}).get("num_workers")
    }
    for warm_name in ("insitu-warm-memory", "insitu-warm-persisted"):
        warm = _by_name(rows, warm_name)
        if warm:
            out[f"{warm_name}_over_cold"] = _ratio(_rate(warm), base)
    return out


def bars(tables: dict[int, list[dict[str, Any]]], main_spc: int, *, isolated: bool = True) -> list[dict[str, Any]]:
    """The design targets this run measures, each with its measured value and verdict.

    Without isolation (every run in one process) peak RSS is not a run's
    own, so the RSS bar is reported without a verdict.
    """
    out: list[dict[str, Any]] = []

    def bar(what: str, measured: float, target: float, spc: int, note: str = "") -> None:
        ok = None if math.isnan(measured) else measured >= target
        out.append({"bar": what, "spc": spc, "measured": measured, "target": target, "passed": ok, "note": note})

    main = tables.get(main_spc, [])
    if main:
        r = ratios(main)
        cold = _by_name(main, "insitu-cold") or {}
        spawn2 = _by_name(main, "dataloader-spawn-2")
        bar(
            "cold >= 10x DataLoader(2 spawn workers, per-sample zarr)", _ratio(_rate(cold), _rate(spawn2)), 10, main_spc
        )
        bar(
            "cold >= 10x the best DataLoader configuration",
            r["over_best_dataloader"],
            10,
            main_spc,
            str(r["best_dataloader"]),
        )
        bar(
            "cold (30 ms store) >= 0.85x decode-bound ceiling, as the design target states it",
            r["fraction_of_decode_ceiling"],
            0.85,
            main_spc,
            "network-bound here: see the raw GET ceiling",
        )
        bar(
            "cold (30 ms store) >= 0.85x the binding ceiling, min(decode, raw GET)",
            r["fraction_of_binding_ceiling"],
            0.85,
            main_spc,
            str(r["binding_ceiling"]),
        )
        bar(
            "local store (network not the limit) >= 0.85x decode-bound ceiling",
            r["local_fraction_of_decode_ceiling"],
            0.85,
            main_spc,
        )
        for name, speedup in r["ttfb_speedup"].items():
            if "spawn" in name:
                bar(f"time to first batch >= 10x faster than {name}", speedup, 10, main_spc)
        out.append(_read_once_bar(cold, main_spc))
        for warm_name in ("insitu-warm-persisted", "insitu-warm-memory"):
            warm = _by_name(main, warm_name)
            if warm:
                bar(
                    f"{warm_name} >= 5x cold epoch",
                    r[f"{warm_name}_over_cold"],
                    5,
                    main_spc,
                    "the bar names the persisted cache" if warm_name.endswith("memory") else "",
                )
                out.append(
                    {
                        "bar": f"{warm_name}: zero GETs",
                        "spc": main_spc,
                        "measured": warm.get("gets"),
                        "target": 0,
                        "passed": warm.get("gets") == 0,
                        "note": "",
                    }
                )
        if cold.get("peak_rss_mb") is not None and "budget_mb" in cold:
            allowed = cold["budget_mb"] + cold["queue_mb"] + cold["inflight_mb"] + RSS_ALLOWANCE_MB
            out.append(
                {
                    "bar": "peak RSS <= budget + queue + in-flight + 300 MB",
                    "spc": main_spc,
                    "measured": cold["peak_rss_mb"],
                    "target": allowed,
                    "passed": cold["peak_rss_mb"] <= allowed if isolated else None,
                    "note": "MB" if isolated else "MB; in-process run, RSS not isolated",
                }
            )
    one = tables.get(1, [])
    if one:
        r = ratios(one)
        bar(
            "one sample per chunk: cold >= 1x the best worker baseline",
            r["over_best_worker_baseline"],
            1,
            1,
            str(r["best_worker_baseline"]),
        )
        bar(
            "one sample per chunk: cold >= 1x the best baseline (incl. contiguous zarr)",
            r["over_best_baseline"],
            1,
            1,
            str(r["best_baseline"]),
        )
        cold = _by_name(one, "insitu-cold") or {}
        out.append(_read_once_bar(cold, 1))
    return out


# -- output ---------------------------------------------------------------------------------------------
def _one_line(row: dict[str, Any]) -> str:
    if row.get("error"):
        return f"  {row['name']:<24} spc {row['spc']:>2}  ERROR {row['error']}"
    if row["loader"] == "fork_probe":
        return f"  {row['name']:<24} outcome {row.get('outcome')} after {row.get('seconds', math.nan):.1f}s"
    return (
        f"  {row['name']:<24} spc {row['spc']:>2}  {_rate(row):>9.1f} samples/s  "
        f"ttfb {row.get('ttfb_s', math.nan):>6.2f}s  rss {row.get('peak_rss_mb', math.nan):>6.0f} MB  "
        f"GETs {row.get('gets', 0):>6}/{row.get('min_gets', '-')}  ({row['wall_s']:.1f}s)"
    )


_FORK_VARIANT_TEXT = {
    "inherit": "the parent opened the store and read; workers use the inherited store",
    "reopen": "the parent read through obstore; each worker opens a new store",
    "clean": "the parent never touched obstore; each worker opens its own store",
}


def _fmt(x: Any, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def markdown(results: dict[str, Any]) -> str:
    """The report as Markdown: tables, ratios, bars, findings, plots."""
    meta = results["meta"]
    lines = [
        f"# insitubatch benchmark ({meta['profile']})",
        "",
        f"Emulated store: {meta['emulator']['latency_s'] * 1e3:.0f} ms + up to "
        f"{meta['emulator']['jitter_s'] * 1e3:.0f} ms jitter to first byte, "
        f"{_fmt(meta['emulator']['bandwidth_mb_s'], '.0f')} MB/s per connection; {meta['cpu_count']} CPUs; "
        f"batch size {meta['batch_size']}; insitubatch {meta['insitu_knobs']}.",
        f"Command: `{meta['command']}`; {meta['elapsed_s']:.0f} s.",
        "",
        f"{stamp_line(meta['measured'])}." if meta.get("measured") else "Measured: date and commit not recorded.",
        "",
    ]
    header = (
        "| loader | samples/s | MB/s | TTFB s | peak RSS MB | GETs | min GETs | insitu × |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for spc, rows in results["tables"].items():
        r = results["ratios"][spc]
        lines += [f"## {spc} sample(s) per chunk", "", header]
        for row in rows:
            if row.get("error"):
                lines.append(f"| {row['name']} | error: {row['error']} |||||||")
                continue
            lines.append(
                f"| {row['name']} | {_fmt(_rate(row))} | {_fmt(row.get('mb_per_s'))} | {_fmt(row.get('ttfb_s'), '.2f')} "
                f"| {_fmt(row.get('peak_rss_mb'), '.0f')} | {_fmt(row.get('gets'), 'd')} | {_fmt(row.get('min_gets'), 'd')} "
                f"| {_fmt(r['insitu_over'].get(row['name']), '.2f')} |"
            )
        lines.append("")
    lines += ["## Bars", "", "| bar | samples/chunk | measured | target | verdict |", "|---|---:|---:|---:|---|"]
    for b in results["bars"]:
        verdict = {True: "pass", False: "MISS", None: "n/a"}[b["passed"]]
        note = f" ({b['note']})" if b.get("note") else ""
        lines.append(
            f"| {b['bar']}{note} | {b['spc']} | {_fmt(b['measured'], '.2f')} | {_fmt(b['target'], '.2f')} | {verdict} |"
        )
    mem = results.get("memory") or {}
    if mem and not mem.get("error"):
        over_base = mem["peak_rss_mb"] - mem["base_rss_mb"]
        lines += [
            "",
            "## Memory: a cold pass over a split many times the pool budget",
            "",
            f"Split {_fmt(mem.get('split_mb'), '.0f')} MB = {_fmt(mem.get('split_over_budget'), '.1f')} × the "
            f"automatic budget (working set {_fmt(mem.get('working_set_mb'), '.1f')} MB, block_chunks "
            f"{mem['config'].get('block_chunks')}).",
            "",
            "| peak RSS MB | RSS before the pass MB | peak − before MB | `insitubatch inspect` bound MB |",
            "|---:|---:|---:|---:|",
            f"| {_fmt(mem['peak_rss_mb'], '.0f')} | {_fmt(mem['base_rss_mb'], '.0f')} | {_fmt(over_base, '.0f')} "
            f"| {_fmt(mem.get('inspect_bound_mb'), '.1f')} |",
        ]
    lines += ["", "## Fork probe (DataLoader, 2 fork workers)", ""]
    for p in results["findings"]["fork"]:
        detail = p.get("error") or (
            f"no batch within {p.get('timeout_s')} s"
            if p.get("outcome") == "hang"
            else f"first batch after {_fmt(p.get('seconds'), '.1f')} s"
        )
        what = _FORK_VARIANT_TEXT.get(p.get("variant") or p.get("config", {}).get("variant"), "")
        lines.append(f"- `{p['name']}` ({what}): **{p.get('outcome', p.get('error'))}**, {detail}")
    lines += [f"- note: {n}" for n in results["findings"].get("notes", [])]
    lines += ["", "## Samples-per-chunk sweep (samples/s)", ""]
    sweep = results["sweeps"]["samples_per_chunk"]
    spcs = sorted({r["spc"] for r in sweep})
    lines += ["| loader | " + " | ".join(str(x) for x in spcs) + " |", "|---|" + "---:|" * len(spcs)]
    for series in sorted({r["series"] for r in sweep}):
        got = {r["spc"]: _rate(r) for r in sweep if r["series"] == series}
        lines.append(f"| {series} | " + " | ".join(_fmt(got.get(x)) for x in spcs) + " |")
    lines += ["", f"## max_inflight sweep (samples/s, {results['meta']['main_spc']} samples per chunk)", ""]
    mi_rows = results["sweeps"]["max_inflight"]
    values = sorted({r["config"].get("max_inflight") or r["config"].get("concurrency") for r in mi_rows})
    lines += ["| | " + " | ".join(str(v) for v in values) + " |", "|---|" + "---:|" * len(values)]
    for loader, label in (("insitu", "insitubatch"), ("get_ceiling", "raw GET ceiling")):
        got = {
            r["config"].get("max_inflight") or r["config"].get("concurrency"): _rate(r)
            for r in mi_rows
            if r["loader"] == loader
        }
        lines.append(f"| {label} | " + " | ".join(_fmt(got.get(v)) for v in values) + " |")
    if results.get("network"):
        from .network import markdown as network_markdown

        lines += ["", network_markdown(results["network"]).rstrip()]
    lines += ["", "## Plots", ""] + [f"- {p}" for p in results.get("plots", [])]
    return "\n".join(lines) + "\n"


def plots(results: dict[str, Any], out: Path) -> list[str]:
    """Throughput vs samples-per-chunk, throughput vs max_inflight, TTFB and RSS bars (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))

    sweep = results["sweeps"]["samples_per_chunk"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for series in sorted({r["series"] for r in sweep}):
        pts = sorted((r["spc"], _rate(r)) for r in sweep if r["series"] == series and not math.isnan(_rate(r)))
        if pts:
            style = "--" if "ceiling" in series else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=series)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="samples per chunk",
        ylabel="samples/s",
        title="Throughput vs samples per chunk",
    )
    ax.set_xticks(sorted({r["spc"] for r in sweep}), labels=[str(s) for s in sorted({r["spc"] for r in sweep})])
    ax.legend(fontsize=8)
    save(fig, "throughput_vs_samples_per_chunk.png")

    mi = results["sweeps"]["max_inflight"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for loader, label in (("insitu", "insitubatch"), ("get_ceiling", "raw GET ceiling")):
        pts = sorted(
            (r["config"].get("max_inflight") or r["config"].get("concurrency"), _rate(r))
            for r in mi
            if r["loader"] == loader and not math.isnan(_rate(r))
        )
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    main_rows = results["tables"].get(str(results["meta"]["main_spc"]), [])
    decode = _by_name(main_rows, "decode-ceiling")
    if decode:
        ax.axhline(_rate(decode), linestyle="--", color="grey", label="decode-bound ceiling")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="max_inflight",
        ylabel="samples/s",
        title=f"Throughput vs max_inflight ({results['meta']['main_spc']} samples per chunk)",
    )
    ax.legend(fontsize=8)
    save(fig, "throughput_vs_max_inflight.png")

    rows = [r for r in main_rows if r.get("ttfb_s") is not None and not r.get("error")]
    for key, name, label in (
        ("ttfb_s", "ttfb.png", "time to first batch (s)"),
        ("peak_rss_mb", "rss.png", "peak RSS of the process tree (MB)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        names = [r["name"] for r in rows]
        values = [r.get(key) or 0.0 for r in rows]
        colors = ["tab:green" if r["loader"].startswith("insitu") else "tab:grey" for r in rows]
        ax.barh(names, values, color=colors)
        if key == "peak_rss_mb":  # the interpreter and its imports, before the loader started
            ax.barh(
                names,
                [r.get("base_rss_mb") or 0.0 for r in rows],
                color="white",
                alpha=0.5,
                hatch="//",
                edgecolor="black",
                label="before the loader (interpreter + imports)",
            )
            ax.legend(fontsize=8, loc="lower right")
        ax.invert_yaxis()
        ax.set(xlabel=label, title=f"{label} ({results['meta']['main_spc']} samples per chunk)")
        save(fig, name)
    return paths


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _insitu_defaults() -> dict[str, Any]:
    from insitubatch.dataset import InSituDataset

    params = inspect.signature(InSituDataset).parameters
    return {k: params[k].default for k in ("max_inflight", "block_chunks", "prefetch_depth")}


def _versions() -> dict[str, str]:
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


def run(
    profile: Profile,
    out: Path,
    *,
    latency_s: float,
    jitter_s: float,
    bandwidth_mb_s: float | None,
    plot: bool = True,
    network: bool = True,
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
    results: dict[str, Any] = {
        "tables": {},
        "ratios": {},
        "sweeps": {"samples_per_chunk": [], "max_inflight": []},
        "findings": {"fork": [], "notes": notes},
    }
    bandwidth = None if bandwidth_mb_s is None else bandwidth_mb_s * MB
    with EmulatorProcess(data_dir, latency_s=latency_s, jitter_s=jitter_s, bandwidth_bytes_per_s=bandwidth) as emu:
        bench = Bench(profile, out, emu, data_dir, specs, knobs, log)
        try:
            log(f"table at {profile.main_spc} samples per chunk")
            main_rows = bench.table(
                profile.main_spc,
                profile.dataloader_grid,
                xb_grid,
                dask=profile.xbatcher_dask and not xb_missing,
                repeats=profile.repeats,
            )
            results["tables"][profile.main_spc] = main_rows
            # at one sample per chunk, the best DataLoader and xbatcher configurations of the main table
            best = [_best(main_rows, (k,)) for k in WORKER_LOADERS]
            grid = {
                k: [(b["config"].get("num_workers", 0), b["config"].get("start_method"))] if b else []
                for k, b in zip(WORKER_LOADERS, best)
            }
            if profile.main_spc != 1:
                log("table at 1 sample per chunk (best DataLoader and xbatcher configurations of the main table)")
                results["tables"][1] = bench.table(
                    1, grid["dataloader"], grid["xbatcher"], dask=False, warm_and_local=profile.warm_and_local_at_1
                )
            log("memory: a cold pass over a split many times the pool budget")
            results["memory"] = bench.memory_pass(profile.main_spc, specs[profile.main_spc])
            log("fork probe")
            results["findings"]["fork"] = bench.fork_probes(profile.main_spc)
            log("samples-per-chunk sweep")
            results["sweeps"]["samples_per_chunk"] = _spc_sweep(bench, profile, results["tables"], grid)
            log("max_inflight sweep")
            results["sweeps"]["max_inflight"] = _inflight_sweep(bench, profile)
        finally:
            bench.close()
    for spc, rows in results["tables"].items():
        results["ratios"][spc] = ratios(rows)
    if network and profile.name == FULL.name:  # the quick smoke run leaves them out (minutes of windows)
        from .network import NET_FULL, run_scenarios

        log("network scenarios")
        results["network"] = run_scenarios(out / "network", NET_FULL, log=log)
    results["bars"] = bars(results["tables"], profile.main_spc, isolated=profile.isolate)
    mem = results.get("memory") or {}
    if mem.get("inspect_bound_mb") is not None:
        # the loader's own threads, clients and allocator arenas are the interpreter's share, as in the RSS bar
        held, allowed = mem["peak_rss_mb"] - mem["base_rss_mb"], mem["inspect_bound_mb"] + RSS_ALLOWANCE_MB
        results["bars"].append(
            {
                "bar": f"memory pass (split {mem['split_over_budget']:.0f}x the budget): peak RSS - RSS before "
                f"<= inspect's bound + {RSS_ALLOWANCE_MB:.0f} MB",
                "spc": profile.main_spc,
                "measured": held,
                "target": allowed,
                "passed": held <= allowed if profile.isolate else None,
                "note": "MB" if profile.isolate else "MB; in-process run, RSS not isolated",
            }
        )
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
    results = _clean(results)
    results["plots"] = plots(results, out) if plot else []
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(markdown(results))
    return results


def _spc_sweep(
    bench: Bench,
    profile: Profile,
    tables: dict[int, list[dict[str, Any]]],
    grid: dict[str, list[tuple[int, str | None]]],
) -> list[dict[str, Any]]:
    """insitubatch, the best DataLoader and xbatcher configurations, zarr and both ceilings per spc."""
    rows = []
    series_of = {
        "insitu-cold": "insitubatch",
        "zarr-contiguous": "zarr (contiguous)",
        "decode-ceiling": "decode ceiling",
        "get-ceiling": "raw GET ceiling",
    }
    for spc in profile.sweep_spcs:
        have = {r["name"]: r for r in tables.get(spc, [])}
        wanted = []
        for kind in WORKER_LOADERS if spc in profile.worker_sweep_spcs else ():
            for workers, method in grid[kind]:
                name = _workers_name(kind, workers, method)
                wanted.append((name, f"{kind} (best: {name})", kind, {"num_workers": workers, "start_method": method}))
        wanted += [("zarr-contiguous", series_of["zarr-contiguous"], "zarr", {})]
        for name, series, loader, cfg in wanted:
            row = have.get(name) or bench.run(spc, name, loader, **cfg)
            rows.append({**row, "series": series})
        cold = have.get("insitu-cold") or bench.insitu(spc, "insitu-cold")
        rows.append({**cold, "series": series_of["insitu-cold"]})
        decode = have.get("decode-ceiling") or bench.run(spc, "decode-ceiling", "decode_ceiling")
        rows.append({**decode, "series": series_of["decode-ceiling"]})
        gets = have.get("get-ceiling") or bench.run(
            spc,
            "get-ceiling",
            "get_ceiling",
            concurrency=ceiling_concurrency(bench.insitu_knobs["max_inflight"], cold),
            window_s=profile.sweep_window_s,
        )
        rows.append({**gets, "series": series_of["get-ceiling"]})
    return rows


def _inflight_sweep(bench: Bench, profile: Profile) -> list[dict[str, Any]]:
    """insitubatch and the raw GET ceiling at each ``max_inflight``, time-boxed."""
    rows = []
    for mi in profile.inflight:
        rows.append(bench.insitu(profile.main_spc, f"insitu-mi{mi}", max_inflight=mi, window_s=profile.sweep_window_s))
        rows.append(
            bench.run(
                profile.main_spc, f"get-ceiling-c{mi}", "get_ceiling", concurrency=mi, window_s=profile.sweep_window_s
            )
        )
    return rows


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
