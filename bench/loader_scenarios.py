"""The report's loader scenarios: every loader at one samples-per-chunk value, the memory pass, the fork probe, the sweeps.

Each function takes the :class:`~bench.children.Bench` of a report run
(one emulator serving the report's link, :mod:`bench.scenarios`, and one
dataset per samples-per-chunk value) and returns its rows; :func:`sections`
runs them in order for ``bench.run`` and ``bench.targets`` judges the rows.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from typing import Any

from insitubatch.testing.data import DatasetSpec

from .children import Bench
from .insitu_loaders import supports_persist
from .profiles import Profile
from .rows import SPLIT_FRACTIONS, best

__all__ = [
    "WORKER_LOADERS",
    "ceiling_concurrency",
    "fork_probes",
    "inflight_sweep",
    "memory_pass",
    "sections",
    "spc_sweep",
    "table",
    "workers_name",
]

# The memory pass reads a split at least this many times the pool budget, so
# memory held past eviction would show; block_chunks is lowered until the split is that large.
MEMORY_SPLIT_OVER_BUDGET = 8
# the working set spans about this many shuffle blocks (the gathered ones and the read-ahead)
WORKING_SET_BLOCKS = 3
WORKER_LOADERS = ("dataloader", "xbatcher")
FORK_PROBE_BATCH = 4
# the raw-GET ceiling's concurrency when an "auto" run did not say what it chose (the engine's old default)
AUTO_FALLBACK_CONCURRENCY = 32


def workers_name(kind: str, workers: int, method: str | None) -> str:
    """A worker baseline's row name: ``dataloader-0``, ``dataloader-spawn-2``, ..."""
    return f"{kind}-{workers}" if workers == 0 else f"{kind}-{method}-{workers}"


def memory_pass(bench: Bench, spc: int, spec: DatasetSpec) -> dict[str, Any]:
    """A cold pass whose split is >= ``MEMORY_SPLIT_OVER_BUDGET`` × the automatic budget, with inspect's bound."""
    train_chunks = int(spec.n_time * SPLIT_FRACTIONS[0]) // spec.samples_per_chunk
    block_chunks = max(
        1,
        min(
            bench.insitu_knobs.get("block_chunks") or train_chunks,
            train_chunks // (MEMORY_SPLIT_OVER_BUDGET * WORKING_SET_BLOCKS),
        ),
    )
    return bench.insitu(spc, "insitu-memory", block_chunks=block_chunks, memory_probe=True)


def table(
    bench: Bench,
    spc: int,
    dataloader_grid: Sequence[tuple[int, str | None]],
    xbatcher_grid: Sequence[tuple[int, str | None]],
    *,
    dask: bool,
    warm_and_local: bool = True,
    repeats: int = 1,
) -> list[dict[str, Any]]:
    """Every loader at ``spc`` samples per chunk; insitubatch and the ceilings ``repeats`` times (median)."""
    rows = [
        bench.run(spc, workers_name(kind, workers, method), kind, num_workers=workers, start_method=method)
        for kind, grid in zip(WORKER_LOADERS, (dataloader_grid, xbatcher_grid))
        for workers, method in grid
    ]
    if dask:
        rows.append(bench.run(spc, "xbatcher-dask-0", "xbatcher", num_workers=0, xarray_chunks={}))
    rows.append(bench.run(spc, "zarr-contiguous", "zarr"))
    cold = bench.insitu(spc, "insitu-cold", repeats=repeats)
    rows.append(cold)
    if warm_and_local:
        rows.extend(_warm_and_local(bench, spc, repeats))
    rows.append(bench.run(spc, "decode-ceiling", "decode_ceiling", repeats=repeats))
    rows.append(
        bench.run(
            spc,
            "get-ceiling",
            "get_ceiling",
            concurrency=ceiling_concurrency(bench.insitu_knobs["max_inflight"], cold),
            window_s=math.inf,
            repeats=repeats,
        )
    )
    return rows


def sections(bench: Bench, xbatcher_grid: Sequence[tuple[int, str | None]], *, dask: bool) -> dict[str, Any]:
    """Every section of the report on ``bench``'s link, in order: the two tables, memory, the fork probe, the sweeps.

    The main table runs the profile's whole loader grid (``xbatcher_grid``
    empty when xbatcher is missing); the table at one sample per chunk, and
    the samples-per-chunk sweep, the best DataLoader and xbatcher
    configurations of the main table.
    """
    profile, log = bench.profile, bench.log
    log(f"table at {profile.main_spc} samples per chunk")
    main_rows = table(
        bench, profile.main_spc, profile.dataloader_grid, xbatcher_grid, dask=dask, repeats=profile.repeats
    )
    tables = {profile.main_spc: main_rows}
    fastest = [best(main_rows, (k,)) for k in WORKER_LOADERS]
    grid = {
        k: [(b["config"].get("num_workers", 0), b["config"].get("start_method"))] if b else []
        for k, b in zip(WORKER_LOADERS, fastest)
    }
    if profile.main_spc != 1:
        log("table at 1 sample per chunk (best DataLoader and xbatcher configurations of the main table)")
        tables[1] = table(
            bench, 1, grid["dataloader"], grid["xbatcher"], dask=False, warm_and_local=profile.warm_and_local_at_1
        )
    log("memory: a cold pass over a split many times the pool budget")
    memory = memory_pass(bench, profile.main_spc, bench.specs[profile.main_spc])
    log("fork probe")
    fork = fork_probes(bench, profile.main_spc)
    log("samples-per-chunk sweep")
    by_spc = spc_sweep(bench, profile, tables, grid)
    log("max_inflight sweep")
    by_inflight = inflight_sweep(bench, profile)
    return {
        "tables": tables,
        "memory": memory,
        "fork": fork,
        "sweeps": {"samples_per_chunk": by_spc, "max_inflight": by_inflight},
    }


def _warm_and_local(bench: Bench, spc: int, repeats: int) -> list[dict[str, Any]]:
    """insitubatch warm (pool, then persisted cache where supported) and on the local directory."""
    rows = [bench.run(spc, "insitu-warm-memory", "insitu_warm", **bench.insitu_knobs, window_s=math.inf)]
    if supports_persist():
        cache_dir = bench.out / "cache" / bench.specs[spc].name
        shutil.rmtree(cache_dir, ignore_errors=True)
        common = {**bench.insitu_knobs, "window_s": math.inf, "cache_dir": str(cache_dir)}
        rows.append(bench.run(spc, "insitu-persist-fill", "insitu_persist", phase="fill", **common))
        rows.append(bench.run(spc, "insitu-warm-persisted", "insitu_persist", phase="warm", **common))
    rows.append(bench.insitu(spc, "insitu-local", url=str(bench.data_dir / bench.specs[spc].name), repeats=repeats))
    return rows


def fork_probes(bench: Bench, spc: int) -> list[dict[str, Any]]:
    """DataLoader ``fork`` workers after the parent used obstore, one row per variant of the profile."""
    n = bench.specs[spc].n_time
    # a small batch: a worker that is not stuck delivers it well inside the timeout
    return [
        bench.run(
            spc,
            f"fork-{variant}",
            "fork_probe",
            variant=variant,
            n_samples=n,
            timeout_s=bench.profile.fork_timeout_s,
            batch_size=FORK_PROBE_BATCH,
        )
        for variant in bench.profile.fork_variants
    ]


def ceiling_concurrency(max_inflight: Any, insitu_row: dict[str, Any]) -> int:
    """The raw-GET ceiling's concurrency: insitubatch's pinned ``max_inflight``, or the limit "auto" chose."""
    if max_inflight != "auto":
        return int(max_inflight)
    return int(insitu_row.get("inflight_median") or AUTO_FALLBACK_CONCURRENCY)


def spc_sweep(
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
                name = workers_name(kind, workers, method)
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


def inflight_sweep(bench: Bench, profile: Profile) -> list[dict[str, Any]]:
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
