"""The report's verdicts: insitubatch's ratios to every baseline and ceiling, and the design targets ("bars").

:func:`ratios` compares one table's rows (one samples-per-chunk value);
:func:`bars` turns the tables into the targets the design states, each
with its measured value, its target and a verdict (pass, miss, or none
where the run could not tell); :func:`memory_bar` judges the memory pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .loader_scenarios import WORKER_LOADERS
from .rows import best, by_name, rate, ratio

__all__ = ["RSS_ALLOWANCE_MB", "bars", "memory_bar", "ratios"]

# The RSS target's allowance for the interpreter and its libraries (peak RSS <= budget + queue +
# in flight + this).
RSS_ALLOWANCE_MB = 300.0
BASELINE_LOADERS = ("dataloader", "xbatcher", "zarr")


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


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """insitubatch cold (its pass rate) over every baseline (steady rate) and ceiling in one table."""
    cold = by_name(rows, "insitu-cold")
    base = rate(cold)
    out: dict[str, Any] = {"insitu_over": {}}
    for r in rows:
        if r["loader"] in BASELINE_LOADERS or r["loader"].endswith("ceiling"):
            out["insitu_over"][r["name"]] = ratio(base, rate(r))
    best_dl, best_worker, best_any = (best(rows, k) for k in (("dataloader",), WORKER_LOADERS, BASELINE_LOADERS))
    out["best_dataloader"] = best_dl and best_dl["name"]
    out["best_worker_baseline"] = best_worker and best_worker["name"]
    out["best_baseline"] = best_any and best_any["name"]
    out["over_best_dataloader"] = ratio(base, rate(best_dl))
    out["over_best_worker_baseline"] = ratio(base, rate(best_worker))
    out["over_best_baseline"] = ratio(base, rate(best_any))
    decode, gets, local = (by_name(rows, n) for n in ("decode-ceiling", "get-ceiling", "insitu-local"))
    out["fraction_of_decode_ceiling"] = ratio(base, rate(decode))
    out["fraction_of_get_ceiling"] = ratio(base, rate(gets))
    out["local_fraction_of_decode_ceiling"] = ratio(rate(local), rate(decode))
    ceilings = [c for c in (decode, gets) if c is not None and not math.isnan(rate(c))]
    binding = min(ceilings, key=rate) if ceilings else None
    out["binding_ceiling"] = binding and binding["name"]
    out["fraction_of_binding_ceiling"] = ratio(base, rate(binding))
    ttfb = (cold or {}).get("ttfb_s", math.nan)
    out["ttfb_speedup"] = {
        r["name"]: ratio(r.get("ttfb_s", math.nan), ttfb)
        for r in rows
        if r["loader"] in WORKER_LOADERS and r.get("config", {}).get("num_workers")
    }
    for warm_name in ("insitu-warm-memory", "insitu-warm-persisted"):
        warm = by_name(rows, warm_name)
        if warm:
            out[f"{warm_name}_over_cold"] = ratio(rate(warm), base)
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
        cold = by_name(main, "insitu-cold") or {}
        spawn2 = by_name(main, "dataloader-spawn-2")
        bar("cold >= 10x DataLoader(2 spawn workers, per-sample zarr)", ratio(rate(cold), rate(spawn2)), 10, main_spc)
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
            warm = by_name(main, warm_name)
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
        cold = by_name(one, "insitu-cold") or {}
        out.append(_read_once_bar(cold, 1))
    return out


def memory_bar(mem: dict[str, Any], spc: int, *, isolated: bool) -> dict[str, Any] | None:
    """The memory pass's bar: peak RSS over the RSS before the pass, against ``insitubatch inspect``'s bound."""
    if mem.get("inspect_bound_mb") is None:
        return None
    # the loader's own threads, clients and allocator arenas are the interpreter's share, as in the RSS bar
    held, allowed = mem["peak_rss_mb"] - mem["base_rss_mb"], mem["inspect_bound_mb"] + RSS_ALLOWANCE_MB
    return {
        "bar": f"memory pass (split {mem['split_over_budget']:.0f}x the budget): peak RSS - RSS before "
        f"<= inspect's bound + {RSS_ALLOWANCE_MB:.0f} MB",
        "spc": spc,
        "measured": held,
        "target": allowed,
        "passed": held <= allowed if isolated else None,
        "note": "MB" if isolated else "MB; in-process run, RSS not isolated",
    }
