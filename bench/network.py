"""Network scenarios: the engine on a heavy-tailed, straggling, throttling or silent emulated bucket.

``python -m bench.network [--quick] [--only NAME ...] [--out DIR]`` (and
``python -m bench.run``, as one section of the report) writes the
ERA5-like data and a sharded copy of it, serves them from an
:class:`~insitubatch.testing.emulator.EmulatorProcess` set up per scenario,
and measures, each run in a fresh child process (``bench.child``;
``insitu_steady`` runs passes back to back and times a window after a
warm-up, so the self-tuning window has settled), with ratios taken within
the one run:

``tail``
    40 ms + an exponential tail: the default knobs (``max_inflight="auto"``)
    against ``max_inflight=32`` (the old default) and the best of a sweep of
    fixed values, and the raw-GET ceiling at 32 and at the limit auto chose.
``stragglers``
    40 ms, 1% of the answers 2 s late, 32 in flight: ``hedge=True`` against
    ``hedge=False``.
``throttle``
    40 ms + the tail, and a share of the GETs answered 503 ``SlowDown`` in
    bursts: the default knobs against 32, with the limit's history and the
    throttling the pass saw.
``cpu``
    No latency: CPU per sample with the default knobs over HTTP and over the
    S3 protocol (an ``S3Store`` on the same emulator) against local files,
    and the client's own CPU for the same GETs alone (raw GETs at the limit
    the HTTP run chose, no decode): the floor the network path adds to the
    local one, whatever the loader does.
``stall``
    30 ms, default settings: what one silent GET adds to a pass (hedging
    off: the stall timer; on: a duplicate), and how long until a key that
    never answers raises ``StoreReadError``.
``sharded``
    30 ms: the sharded copy (``SHARD_SAMPLES`` steps per shard) against the
    unsharded data, cold passes (``cold_rounds`` of each, alternated; the
    ratios are of the medians): time to first batch, peak RSS and bytes on
    the wire.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from insitubatch.testing.data import DatasetSpec, wb2_64x32, write_era5_like
from insitubatch.testing.emulator import DEFAULT_JITTER_S, EmulatorProcess

from .children import Bench
from .network_report import SCENARIOS, markdown
from .profiles import FULL, QUICK
from .rows import SPLIT_FRACTIONS, clean, rate, ratio

__all__ = ["NET_FULL", "NET_QUICK", "NetProfile", "markdown", "run_scenarios"]

# The links, as the issue measured them: a 40 ms floor with an exponential tail of 20 ms mean (its p99
# about 140 ms); 1% of the answers 2 s late; throttling bursts of 2 s every 6 s on 5% of the GETs.
TAIL_LATENCY_S = 0.040
TAIL_MEAN_S = 0.020
STRAGGLER_SHARE = 0.01
STRAGGLER_S = 2.0
THROTTLE_SHARE = 0.05
THROTTLE_PERIOD_S = 6.0
THROTTLE_BURST_S = 2.0
STALL_LATENCY_S = 0.030
SHARD_SAMPLES = 64
PINNED = 32  # the fixed value the engine (and the pure-Python reference design) used before "auto"
TAIL_LINK = {"latency_s": TAIL_LATENCY_S, "jitter_s": DEFAULT_JITTER_S, "tail_s": TAIL_MEAN_S}


@dataclass(frozen=True)
class NetProfile:
    """How long the network scenarios measure."""

    name: str
    n_time: int
    warmup_s: float
    window_s: float
    sweep: tuple[int, ...]
    dead_object: bool  # time a key that never answers with the default settings (about 45 s)
    cold_rounds: int  # cold passes of each archive in the sharded scenario


NET_FULL = NetProfile(
    "full", n_time=5840, warmup_s=4.0, window_s=8.0, sweep=(16, 32, 64, 128, 256), dead_object=True, cold_rounds=5
)
NET_QUICK = NetProfile("quick", n_time=384, warmup_s=0.5, window_s=1.0, sweep=(32,), dead_object=False, cold_rounds=1)


class _Runs:
    """Children against one emulator process for one dataset (``bench.children.Bench``, one spec)."""

    def __init__(self, out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None], **link):
        self.emu = EmulatorProcess(data, **link)
        self.spec = spec
        self.net = net
        profile = replace(FULL if net.name == "full" else QUICK, isolate=True)
        out.mkdir(parents=True, exist_ok=True)
        self.bench = Bench(profile, out, self.emu, data, {spec.samples_per_chunk: spec}, {}, log)

    def steady(self, name: str, **cfg: Any) -> dict[str, Any]:
        net = self.net
        return self.bench.run(
            self.spec.samples_per_chunk, name, "insitu_steady", warmup_s=net.warmup_s, window_s=net.window_s, **cfg
        )

    def run(self, name: str, loader: str, **cfg: Any) -> dict[str, Any]:
        return self.bench.run(self.spec.samples_per_chunk, name, loader, **cfg)

    def close(self) -> None:
        self.bench.close()
        self.emu.close()

    def __enter__(self) -> _Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chosen(row: dict[str, Any]) -> int | None:
    last = row.get("last_pass") or {}
    return last.get("inflight_median")


def tail(out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None]) -> dict[str, Any]:
    link = dict(TAIL_LINK)
    with _Runs(out / "tail", data, spec, net, log, **link) as runs:
        auto = runs.steady("auto")
        fixed = {mi: runs.steady(f"fixed-{mi}", max_inflight=mi) for mi in sorted(set(net.sweep) | {PINNED})}
        chosen = _chosen(auto) or PINNED
        window = net.window_s
        ceilings = {
            c: runs.run(f"get-ceiling-c{c}", "get_ceiling", concurrency=c, window_s=window) for c in {PINNED, chosen}
        }
    best = max(fixed, key=lambda mi: rate(fixed[mi]))
    return {
        "link": link,
        "rows": [auto, *fixed.values(), *ceilings.values()],
        "auto_limit_median": chosen,
        "best_fixed": best,
        "auto_over_fixed_32": ratio(rate(auto), rate(fixed[PINNED])),
        "auto_over_best_fixed": ratio(rate(auto), rate(fixed[best])),
        "fixed_32_over_get_ceiling_32": ratio(rate(fixed[PINNED]), rate(ceilings[PINNED])),
        "auto_over_get_ceiling_at_its_limit": ratio(rate(auto), rate(ceilings[chosen])),
    }


def stragglers(out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None]) -> dict[str, Any]:
    link = {**TAIL_LINK, "tail_s": 0.0, "straggler_share": STRAGGLER_SHARE, "straggler_s": STRAGGLER_S}
    with _Runs(out / "stragglers", data, spec, net, log, **link) as runs:
        hedged = runs.steady("hedge-32", max_inflight=PINNED, hedge=True)
        plain = runs.steady("no-hedge-32", max_inflight=PINNED, hedge=False)
        auto = runs.steady("auto")
    last = hedged.get("last_pass") or {}
    return {
        "link": link,
        "rows": [hedged, plain, auto],
        "hedged_over_not": ratio(rate(hedged), rate(plain)),
        "auto_over_no_hedge_32": ratio(rate(auto), rate(plain)),
        "hedged_share_of_gets": ratio(float(last.get("hedged", math.nan)), float(last.get("gets", math.nan))),
    }


def throttle(out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None]) -> dict[str, Any]:
    link = {
        **TAIL_LINK,
        "throttle_share": THROTTLE_SHARE,
        "throttle_period_s": THROTTLE_PERIOD_S,
        "throttle_burst_s": THROTTLE_BURST_S,
    }
    with _Runs(out / "throttle", data, spec, net, log, **link) as runs:
        auto = runs.steady("auto")
        fixed = runs.steady(f"fixed-{PINNED}", max_inflight=PINNED)
    return {"link": link, "rows": [auto, fixed], "auto_over_fixed_32": ratio(rate(auto), rate(fixed))}


def cpu(out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None]) -> dict[str, Any]:
    with _Runs(out / "cpu", data, spec, net, log, latency_s=0.0, jitter_s=0.0) as runs:
        s3 = {"endpoint": runs.emu.url, "anonymous": True, "region": "us-east-1"}
        rows = {
            "local": runs.steady("local", url=str(data / spec.name)),
            "http": runs.steady("http"),
            "s3": runs.steady("s3", url=f"s3://{spec.name}", store_options=s3),
            "http-fixed-32": runs.steady("http-fixed-32", max_inflight=PINNED),
        }
        chosen = _chosen(rows["http"]) or PINNED
        floor = runs.run(f"get-floor-c{chosen}", "get_ceiling", concurrency=chosen, window_s=net.window_s)
    local = rows["local"].get("cpu_us_per_sample", math.nan)
    get_floor = floor.get("cpu_us_per_sample", math.nan)
    return {
        "rows": [*rows.values(), floor],
        **{f"cpu_{k}_over_local": ratio(r.get("cpu_us_per_sample", math.nan), local) for k, r in rows.items()},
        "cpu_get_floor_over_local": ratio(get_floor, local),
        "cpu_http_over_local_plus_get_floor": ratio(rows["http"].get("cpu_us_per_sample", math.nan), local + get_floor),
    }


def stall(out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None]) -> dict[str, Any]:
    """In this process: what one silent GET adds to a sequential pass, and when a dead key raises."""
    from insitubatch.dataset import InSituDataset
    from insitubatch.errors import StoreReadError
    from insitubatch.io.group import open_geometries
    from insitubatch.plan.splits import split_by_chunk
    from insitubatch.stores.obstore_stores import obstore_store
    from insitubatch.stores.owned import close_store

    result: dict[str, Any] = {"link": {"latency_s": STALL_LATENCY_S}}
    with EmulatorProcess(data, latency_s=STALL_LATENCY_S, jitter_s=DEFAULT_JITTER_S) as emu:
        store = obstore_store(emu.url_for(spec.name), read_only=True)
        geoms = open_geometries(store, variables=list(spec.variables))
        manifest = split_by_chunk(next(iter(geoms.values())), fractions=SPLIT_FRACTIONS)
        g = next(iter(geoms.values()))
        chunk = manifest.chunks("train")[len(manifest.chunks("train")) // 2]
        key = f"{spec.name}/{g.chunk_key(g.physical_chunk_coord(chunk, 0))}"

        def timed_pass(**kw: Any) -> float:
            with InSituDataset(store, manifest, geoms, shuffle=False, **kw) as ds:
                t0 = time.perf_counter()
                for _ in ds.train:
                    pass
                return time.perf_counter() - t0

        for hedge in (False, True):
            timed_pass(hedge=hedge)  # the link's latency is learnt
            plain = timed_pass(hedge=hedge)
            emu.configure(hold_key=key, hold_times=1)
            held = timed_pass(hedge=hedge)
            emu.configure(hold_key=None, hold_times=None)
            result[f"silent_get_added_s_hedge_{hedge}"] = held - plain
            log(f"stall: one silent GET (hedge={hedge}) added {held - plain:.2f} s to a {plain:.2f} s pass")
        if net.dead_object:
            emu.configure(hold_key=key, hold_times=None)  # every GET of it, for good
            t0 = time.perf_counter()
            try:
                timed_pass()
            except StoreReadError as exc:
                result["dead_object_raised_s"] = time.perf_counter() - t0
                result["dead_object_error"] = str(exc)[:300]
            emu.configure(hold_key=None)
            log(f"stall: a key that never answers raised after {result.get('dead_object_raised_s', math.nan):.1f} s")
        close_store(store)
    return result


def sharded(out: Path, data: Path, spec: DatasetSpec, net: NetProfile, log: Callable[[str], None]) -> dict[str, Any]:
    shard_spec = replace(spec, shard_samples=SHARD_SAMPLES)
    write_era5_like(data / shard_spec.name, shard_spec)
    rows: dict[str, list[dict[str, Any]]] = {"unsharded": [], "sharded": []}
    with contextlib.ExitStack() as stack:
        runs = {
            label: stack.enter_context(_Runs(out / f"sharded-{label}", data, s, net, log, latency_s=STALL_LATENCY_S))
            for label, s in (("unsharded", spec), ("sharded", shard_spec))
        }
        for r in range(net.cold_rounds):  # alternated, so a slow moment of the machine falls on both
            for label, run in runs.items():
                rows[label].append(run.run(f"{label}-{r + 1}", "insitu", window_s=math.inf))

    def median(label: str, k: str) -> float:
        values = [float(row[k]) for row in rows[label] if row.get(k) is not None and not row.get("error")]
        return statistics.median(values) if values else math.nan

    return {
        "rows": [*rows["unsharded"], *rows["sharded"]],
        "shard_samples": SHARD_SAMPLES,
        "cold_rounds": net.cold_rounds,
        **{
            f"{k}_sharded_over_unsharded": ratio(median("sharded", k), median("unsharded", k))
            for k in ("ttfb_s", "peak_rss_mb", "wire_mb", "rate_samples_per_s")
        },
    }


_SCENARIO_FUNCS = {
    "tail": tail,
    "stragglers": stragglers,
    "throttle": throttle,
    "cpu": cpu,
    "stall": stall,
    "sharded": sharded,
}


def run_scenarios(
    out: Path, net: NetProfile, only: tuple[str, ...] = SCENARIOS, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Measure the scenarios named in ``only``; returns ``{scenario: result}`` (also ``out/network.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    data.mkdir(exist_ok=True)
    spec = wb2_64x32(net.n_time, samples_per_chunk=8)
    write_era5_like(data / spec.name, spec)
    results: dict[str, Any] = {"profile": net.name, "dataset": spec.name}
    for name in only:
        log(f"network scenario: {name}")
        t0 = time.perf_counter()
        results[name] = _SCENARIO_FUNCS[name](out, data, spec, net, log)
        results[name]["elapsed_s"] = time.perf_counter() - t0
    (out / "network.json").write_text(json.dumps(clean(results), indent=2))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small dataset and short windows")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "insitubatch-network")
    args = parser.parse_args(argv)
    results = run_scenarios(args.out.resolve(), NET_QUICK if args.quick else NET_FULL, tuple(args.only))
    print()
    print(markdown(clean(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
