"""Network scenarios: the engine on a heavy-tailed, straggling, throttling or silent emulated bucket.

``python -m bench.network [--quick] [--only NAME ...] [--out DIR]`` (and
``python -m bench.run``, as one section of the report) writes the
ERA5-like data and a sharded copy of it, and for each scenario of its
table (:data:`SCENARIOS`: a link of the bench's scenarios, :mod:`bench.scenarios`,
under this list's name, and the measurement :data:`MEASURES` names for it)
serves them from an :class:`~insitubatch.testing.emulator.EmulatorProcess`
with that link (:func:`bench.scenarios.measure_each`, the arena's harness too)
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
from insitubatch.testing.emulator import EmulatorProcess

from .children import Bench
from .network_report import markdown
from .profiles import FULL, QUICK
from .rows import SPLIT_FRACTIONS, clean, rate, ratio
from .scenarios import HTTP0, HTTP30, STRAGGLERS, TAIL, THROTTLE, Scenario, measure_each

__all__ = ["NET_FULL", "NET_QUICK", "SCENARIOS", "NetProfile", "markdown", "run_scenarios"]

SHARD_SAMPLES = 64
PINNED = 32  # the fixed value the engine (and the pure-Python reference design) used before "auto"


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
    """A network scenario's children against its served link, for one dataset (``bench.children.Bench``, one spec)."""

    def __init__(
        self,
        scenario: Scenario,
        emu: EmulatorProcess,
        out: Path,
        data: Path,
        spec: DatasetSpec,
        net: NetProfile,
        log: Callable[[str], None],
    ) -> None:
        self.scenario = scenario
        self.emu = emu
        self.out = out
        self.data = data
        self.spec = spec
        self.net = net
        self.log = log
        profile = replace(FULL if net.name == "full" else QUICK, isolate=True)
        out.mkdir(parents=True, exist_ok=True)
        self.bench = Bench(profile, out, emu, data, {spec.samples_per_chunk: spec}, {}, log)

    def steady(self, name: str, **cfg: Any) -> dict[str, Any]:
        net = self.net
        return self.bench.run(
            self.spec.samples_per_chunk, name, "insitu_steady", warmup_s=net.warmup_s, window_s=net.window_s, **cfg
        )

    def run(self, name: str, loader: str, **cfg: Any) -> dict[str, Any]:
        return self.bench.run(self.spec.samples_per_chunk, name, loader, **cfg)

    def of(self, spec: DatasetSpec, label: str) -> _Runs:
        """The same link's children for another dataset, their log under ``out/label``."""
        return _Runs(self.scenario, self.emu, self.out / label, self.data, spec, self.net, self.log)

    def close(self) -> None:
        self.bench.close()

    def __enter__(self) -> _Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chosen(row: dict[str, Any]) -> int | None:
    last = row.get("last_pass") or {}
    return last.get("inflight_median")


def tail(runs: _Runs) -> dict[str, Any]:
    """The default knobs against 32 and the best of a fixed sweep, and the raw-GET ceilings at both limits."""
    auto = runs.steady("auto")
    fixed = {mi: runs.steady(f"fixed-{mi}", max_inflight=mi) for mi in sorted(set(runs.net.sweep) | {PINNED})}
    chosen = _chosen(auto) or PINNED
    window = runs.net.window_s
    ceilings = {
        c: runs.run(f"get-ceiling-c{c}", "get_ceiling", concurrency=c, window_s=window) for c in {PINNED, chosen}
    }
    best = max(fixed, key=lambda mi: rate(fixed[mi]))
    return {
        "rows": [auto, *fixed.values(), *ceilings.values()],
        "auto_limit_median": chosen,
        "best_fixed": best,
        "auto_over_fixed_32": ratio(rate(auto), rate(fixed[PINNED])),
        "auto_over_best_fixed": ratio(rate(auto), rate(fixed[best])),
        "fixed_32_over_get_ceiling_32": ratio(rate(fixed[PINNED]), rate(ceilings[PINNED])),
        "auto_over_get_ceiling_at_its_limit": ratio(rate(auto), rate(ceilings[chosen])),
    }


def stragglers(runs: _Runs) -> dict[str, Any]:
    """Hedging on against off at 32 in flight, and the default knobs."""
    hedged = runs.steady("hedge-32", max_inflight=PINNED, hedge=True)
    plain = runs.steady("no-hedge-32", max_inflight=PINNED, hedge=False)
    auto = runs.steady("auto")
    last = hedged.get("last_pass") or {}
    return {
        "rows": [hedged, plain, auto],
        "hedged_over_not": ratio(rate(hedged), rate(plain)),
        "auto_over_no_hedge_32": ratio(rate(auto), rate(plain)),
        "hedged_share_of_gets": ratio(float(last.get("hedged", math.nan)), float(last.get("gets", math.nan))),
    }


def throttle(runs: _Runs) -> dict[str, Any]:
    """The default knobs against 32 in flight under throttling bursts."""
    auto = runs.steady("auto")
    fixed = runs.steady(f"fixed-{PINNED}", max_inflight=PINNED)
    return {"rows": [auto, fixed], "auto_over_fixed_32": ratio(rate(auto), rate(fixed))}


def cpu(runs: _Runs) -> dict[str, Any]:
    """CPU per sample over HTTP and S3 against local files, and the raw GETs' own CPU at the limit HTTP chose."""
    s3 = {"endpoint": runs.emu.url, "anonymous": True, "region": "us-east-1"}
    rows = {
        "local": runs.steady("local", url=str(runs.data / runs.spec.name)),
        "http": runs.steady("http"),
        "s3": runs.steady("s3", url=f"s3://{runs.spec.name}", store_options=s3),
        "http-fixed-32": runs.steady("http-fixed-32", max_inflight=PINNED),
    }
    chosen = _chosen(rows["http"]) or PINNED
    floor = runs.run(f"get-floor-c{chosen}", "get_ceiling", concurrency=chosen, window_s=runs.net.window_s)
    local = rows["local"].get("cpu_us_per_sample", math.nan)
    get_floor = floor.get("cpu_us_per_sample", math.nan)
    return {
        "rows": [*rows.values(), floor],
        **{f"cpu_{k}_over_local": ratio(r.get("cpu_us_per_sample", math.nan), local) for k, r in rows.items()},
        "cpu_get_floor_over_local": ratio(get_floor, local),
        "cpu_http_over_local_plus_get_floor": ratio(rows["http"].get("cpu_us_per_sample", math.nan), local + get_floor),
    }


def stall(runs: _Runs) -> dict[str, Any]:
    """In this process: what one silent GET adds to a sequential pass, and when a dead key raises."""
    from insitubatch.dataset import InSituDataset
    from insitubatch.errors import StoreReadError
    from insitubatch.io.group import open_geometries
    from insitubatch.plan.splits import split_by_chunk
    from insitubatch.stores.obstore_stores import obstore_store
    from insitubatch.stores.owned import close_store

    emu, spec, log = runs.emu, runs.spec, runs.log
    result: dict[str, Any] = {}
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
    if runs.net.dead_object:
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


def sharded(runs: _Runs) -> dict[str, Any]:
    """Cold passes of the sharded copy against the unsharded data, alternated, on the same link."""
    net = runs.net
    shard_spec = replace(runs.spec, shard_samples=SHARD_SAMPLES)
    write_era5_like(runs.data / shard_spec.name, shard_spec)
    rows: dict[str, list[dict[str, Any]]] = {"unsharded": [], "sharded": []}
    with runs.of(runs.spec, "unsharded") as plain, runs.of(shard_spec, "sharded") as shards:
        for r in range(net.cold_rounds):  # alternated, so a slow moment of the machine falls on both
            for label, run in (("unsharded", plain), ("sharded", shards)):
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


# The network scenarios, in the order they are measured and reported: each a link of the bench's
# scenarios (``bench.scenarios``) under this list's name, and what is measured on it.
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        replace(TAIL, what="40 ms + exponential tail: the default knobs against 32 and a fixed sweep"),
        replace(STRAGGLERS, what="40 ms, 1% of answers 2 s late: hedged against not"),
        replace(THROTTLE, what="40 ms + tail, 503 SlowDown bursts: the default knobs against 32"),
        replace(HTTP0, name="cpu", what="0 ms: CPU per sample over HTTP and S3 against local files"),
        replace(HTTP30, name="stall", what="30 ms: one silent GET, and a key that never answers"),
        replace(HTTP30, name="sharded", what="30 ms: the sharded copy against the unsharded data, cold"),
    )
}
MEASURES: dict[str, Callable[[_Runs], dict[str, Any]]] = {
    "tail": tail,
    "stragglers": stragglers,
    "throttle": throttle,
    "cpu": cpu,
    "stall": stall,
    "sharded": sharded,
}


def run_scenarios(
    out: Path, net: NetProfile, only: tuple[str, ...] = tuple(SCENARIOS), log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Measure the scenarios named in ``only``; returns ``{scenario: result}`` (also ``out/network.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    data.mkdir(exist_ok=True)
    spec = wb2_64x32(net.n_time, samples_per_chunk=8)
    write_era5_like(data / spec.name, spec)

    def measure(scenario: Scenario, emu: EmulatorProcess | None) -> dict[str, Any]:
        assert emu is not None  # every network scenario is remote
        t0 = time.perf_counter()
        with _Runs(scenario, emu, out / scenario.name, data, spec, net, log) as runs:
            found = MEASURES[scenario.name](runs)
        return {"link": scenario.link, **found, "elapsed_s": time.perf_counter() - t0}

    results: dict[str, Any] = {"profile": net.name, "dataset": spec.name}
    scenarios = [SCENARIOS[name] for name in only]
    results.update(measure_each(scenarios, data, measure, label="network scenario", log=log))
    (out / "network.json").write_text(json.dumps(clean(results), indent=2))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small dataset and short windows")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "insitubatch-network")
    args = parser.parse_args(argv)
    results = run_scenarios(args.out.resolve(), NET_QUICK if args.quick else NET_FULL, tuple(args.only))
    print()
    print(markdown(clean(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
