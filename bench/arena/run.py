"""The arena: our loader, the reference design (insitubatch 0.2.0) and TensorStore, side by side on ERA5-shaped data.

``python -m bench.arena [--quick] [--only SCENARIO ...] [--loaders ours,reference,tensorstore]
[--cold-only | --no-cold] [--data DIR] [--out DIR] [--reference-venv DIR] [--reference-python PATH]``

writes the realistic dataset once (cached by spec under ``--data``), then
for each scenario (:data:`bench.arena.scenarios.SCENARIOS`: local files,
HTTP at 0 and 30 ms, a heavy-tailed 100 MB/s link, stragglers, the S3
protocol) serves it from an :class:`~insitubatch.testing.emulator.EmulatorProcess`
(its own process: the server's CPU is never the loader's) and times each
loader in a fresh child process (the bench's one child runner,
:class:`bench.children.Children` and :mod:`bench.child`) at its default
knobs, in steady state, then over one cold pass (a fresh child, the open
included; TensorStore with a cache that holds the split, issue 45;
``--cold-only`` runs just these, ``--no-cold`` leaves them out). Ours also
gets the raw-GET ceiling at the reads-in-flight its passes reached, and one
decode ceiling (numcodecs, no I/O, as many threads as our decode pool): the
report's ceilings (:mod:`bench.ceilings`). It prints the tables and writes
``arena.json`` and ``arena.md`` to ``--out`` (default ``bench/out/``), with
the ratios and the bars of issues 38 and 45 (:mod:`bench.arena.report`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from insitubatch.testing.data import write_era5_like
from insitubatch.testing.emulator import EmulatorProcess

from ..children import Children
from ..measure import loadavg
from ..rows import MB, REPO_ROOT, SPLIT_FRACTIONS, clean
from ..scenarios import Scenario, measure_each
from .peers import reference_python, tensorstore_available
from .report import bars, markdown, ratios
from .scenarios import FULL, LOADERS, QUICK, SCENARIOS, ArenaProfile
from .tensorstore_loop import BATCHES_AHEAD

__all__ = ["main", "run_arena"]

DEFAULT_OUT = REPO_ROOT / "bench" / "out"
# The reference's venv lives outside the repository (a tree of another insitubatch's .py files under bench/
# would be read by tests/test_bench_layout.py), in the user's cache, made once and reused.
DEFAULT_REFERENCE_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "insitubatch" / "arena-reference-venv"
)
# The concurrency the raw-GET ceiling replays at when our pass reported none (a pass that never reached the store).
FALLBACK_CONCURRENCY = 32
# TensorStore's cache in the cold pass: the split's decoded tiles and this much more (the cache's own bookkeeping),
# so that one pass never evicts (issue 45 compares one cold pass against "a cache that holds the split").
SPLIT_CACHE_MARGIN = 1.25


def _one_line(scenario: str, row: dict[str, Any]) -> str:
    head = f"  {scenario:<15} {row['loader']:<14}"
    if row.get("error"):
        return f"{head} ERROR {row['error']}"
    rate, cpu = row.get("rate_samples_per_s"), row.get("cpu_s_per_sample")
    return (
        f"{head} {rate or float('nan'):>9.1f} samples/s  CPU {1e3 * (cpu or float('nan')):>6.2f} ms/sample  "
        f"peak RSS {row.get('peak_rss_mb', float('nan')):>6.0f} MB  ({row['wall_s']:.0f} s)"
    )


def split_decoded_bytes(geometries: dict[str, Any], train: np.ndarray) -> int:
    """Decoded bytes of every stored tile the samples ``train`` touch, over ``geometries`` (``ArrayGeometry`` by name).

    Each tile counts whole (an edge tile padded to the full tile shape), as
    TensorStore's chunk cache holds it: the bytes a cache must hold to keep
    the whole split decoded.
    """
    total = 0
    for g in geometries.values():
        chunks = len(np.unique(np.asarray(train) // g.sample_chunk_size))
        total += chunks * g.tiles_per_chunk * g.tile_nbytes
    return total


def our_plan(path: Path, profile: ArenaProfile, out: Path) -> dict[str, Any]:
    """Our train order per epoch (for TensorStore, saved as ``.npy``), our pool's budget on local files, and the
    split's decoded bytes with TensorStore's cache for the cold pass (:data:`SPLIT_CACHE_MARGIN` more)."""
    from insitubatch.dataset import InSituDataset
    from insitubatch.io.group import open_geometries
    from insitubatch.plan.splits import split_by_chunk
    from insitubatch.stores.obstore_stores import obstore_store

    variables = list(profile.spec.variables)
    store = obstore_store(str(path), read_only=True)
    geoms = open_geometries(store, variables=variables)
    manifest = split_by_chunk(next(iter(geoms.values())), fractions=SPLIT_FRACTIONS)
    with InSituDataset(store, manifest, variables, batch_size=profile.batch_size) as ds:
        orders = np.stack([ds.plan("train", e).anchors for e in range(profile.orders_epochs)]).astype(np.int64)
        budget = int(ds.describe()["memory"]["budget_bytes"])
    split_bytes = split_decoded_bytes(geoms, manifest.sample_indices("train"))
    orders_path = out / f"orders-{profile.spec.name}-bs{profile.batch_size}.npy"
    np.save(orders_path, orders)
    return {
        "orders_path": str(orders_path),
        "budget_bytes": budget,
        "train_samples": int(orders.shape[1]),
        "split_bytes": split_bytes,
        "split_cache_bytes": int(split_bytes * SPLIT_CACHE_MARGIN),
    }


def _peers(
    loaders: Sequence[str], work: Path, ref_venv: Path, ref_python: str | None, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    peers: dict[str, dict[str, Any]] = {}
    if "reference" in loaders:
        python, why = reference_python(ref_venv, REPO_ROOT, base_python=ref_python, log=log)
        peers["reference"] = (
            {"python": python, "what": f"insitubatch 0.2.0 from PyPI in {ref_venv}, at its defaults"}
            if python
            else {"skipped": why}
        )
    if "tensorstore" in loaders:
        why = tensorstore_available()
        peers["tensorstore"] = (
            {"skipped": why}
            if why
            else {
                "what": f"a loop over array[indices].read(), {BATCHES_AHEAD} batches ahead, cache = our budget"
                " (steady state), a cache that holds the split (one cold pass)"
            }
        )
    return peers


def _versions(peers: dict[str, dict[str, Any]]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("insitubatch", "zarr", "numcodecs", "obstore", "numpy", "tensorstore"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    if peers.get("reference", {}).get("python"):
        out["reference"] = "insitubatch 0.2.0 (its own venv)"
    return out


def run_arena(
    profile: ArenaProfile,
    out: Path,
    data: Path,
    *,
    only: Sequence[str] = tuple(SCENARIOS),
    loaders: Sequence[str] = LOADERS,
    ref_venv: Path,
    ref_python: str | None = None,
    cold: bool = True,
    cold_only: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure ``loaders`` in the scenarios ``only``; write ``arena.json`` and ``arena.md`` under ``out``.

    In each scenario every loader is timed in steady state (not with
    ``cold_only``: nor is the decode ceiling), then over one cold pass
    (with ``cold`` or ``cold_only``).
    """
    started = time.perf_counter()
    load_start = loadavg()
    work = out / "arena"
    work.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    spec = profile.spec
    t0 = time.perf_counter()
    write_era5_like(data / spec.name, spec)
    log(f"arena: data {spec.name} ready in {time.perf_counter() - t0:.0f} s; load average {load_start}")
    peers = _peers(loaders, work, ref_venv, ref_python, log)
    plan = our_plan(data / spec.name, profile, work)
    children = Children(work / "children.log", profile.child_timeout_s)

    def run(cfg: dict[str, Any], python: str | None = None, emu: EmulatorProcess | None = None) -> dict[str, Any]:
        name = f"{cfg['scenario']} cold" if cfg.get("mode") == "cold" else cfg["scenario"]
        row = children.run(cfg, title=f"{name} {cfg['loader']}", python=python, emu=emu, spec=spec)
        log(_one_line(name, row))
        return row

    base = {"variables": list(spec.variables), "fractions": list(SPLIT_FRACTIONS), "repo_root": str(REPO_ROOT)}
    base.update(profile.child_config())

    def loader_rows(scenario: Scenario, emu: EmulatorProcess | None, mode: str) -> dict[str, Any]:
        """Each loader on ``scenario``'s link, in ``mode``: ``"steady"`` (TensorStore's cache = our budget; ours'
        raw-GET ceiling where there is a link) or ``"cold"``, one whole pass (TensorStore's cache holds the split)."""
        rows: dict[str, Any] = {}
        where = {"scenario": scenario.name, "location": scenario.location(data, spec.name, emu)}
        for loader in loaders:
            peer = peers.get(loader, {})
            if peer.get("skipped"):
                rows[loader] = {"loader": loader, "skipped": peer["skipped"]}
                continue
            cfg = {**base, **where, "loader": loader}
            if mode == "cold":
                cfg["mode"] = "cold"
            if loader == "tensorstore" and mode == "cold":
                cfg.update(orders_path=plan["orders_path"], cache_bytes=plan["split_cache_bytes"], cache_is="the split")
            elif loader == "tensorstore":
                budget = (rows.get("ours") or {}).get("budget_mb")
                cfg.update(
                    orders_path=plan["orders_path"],
                    cache_bytes=int(budget * MB) if budget else plan["budget_bytes"],
                )
            rows[loader] = run(cfg, peer.get("python"), emu)
            if mode == "steady" and loader == "ours" and scenario.remote and not rows["ours"].get("error"):
                reached = rows["ours"].get("inflight_peak") or FALLBACK_CONCURRENCY
                ceiling = {**base, **where, "loader": "get_ceiling", "concurrency": int(reached)}
                rows["get_ceiling"] = run(ceiling, None, emu)
        return rows

    def every_loader(scenario: Scenario, emu: EmulatorProcess | None) -> dict[str, Any]:
        """``scenario``'s rows: the steady ones (unless ``cold_only``), then the cold passes (if ``cold``)."""
        out = {"what": scenario.what, "link": scenario.link}
        out["rows"] = {} if cold_only else loader_rows(scenario, emu, "steady")
        if cold or cold_only:
            out["cold_rows"] = loader_rows(scenario, emu, "cold")
        return out

    results: dict[str, Any] = {}
    try:
        scenarios = [SCENARIOS[name] for name in only]
        results["scenarios"] = measure_each(scenarios, data, every_loader, label="arena", log=log)
        if "ours" in loaders and not cold_only:
            local = results["scenarios"].get("local", {}).get("rows", {}).get("ours") or {}
            threads = local.get("decode_threads") or os.cpu_count() or 1
            cfg = {**base, "scenario": "decode", "loader": "decode_ceiling", "threads": int(threads)}
            cfg.update(decoder="numcodecs", location={"kind": "file", "path": str(data / spec.name)})
            results["decode_ceiling"] = run(cfg)
    finally:
        children.close()
    results["ratios"] = ratios(results)
    results["bars"] = bars(results["ratios"])
    results["meta"] = {
        "profile": profile.name,
        "command": " ".join(["python", "-m", "bench.arena", *sys.argv[1:]]),
        "elapsed_s": time.perf_counter() - started,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "cpu_count": os.cpu_count(),
        "dataset": {**asdict(spec), "name": spec.name, "chunks": spec.chunks, "train_samples": plan["train_samples"]},
        "fractions": list(SPLIT_FRACTIONS),
        "batch_size": profile.batch_size,
        "timing": (
            f"{profile.warmup_passes} warm-up pass(es), at least {profile.warmup_s:g} s and at most"
            f" {profile.warmup_max_s:g} s, then a {profile.window_s:g} s window of passes"
        ),
        "peers": {k: {kk: vv for kk, vv in v.items() if kk != "python"} for k, v in peers.items()},
        "versions": _versions(peers),
        "cold": (
            f"one pass in a fresh child, from before the open to the last batch; TensorStore's cache"
            f" {plan['split_cache_bytes'] / MB:,.0f} MB: the split's {plan['split_bytes'] / MB:,.0f} MB of decoded"
            f" tiles x {SPLIT_CACHE_MARGIN:g}"
        )
        if cold or cold_only
        else None,
    }
    results = clean(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "arena.json").write_text(json.dumps(results, indent=2))
    (out / "arena.md").write_text(markdown(results))
    return results


def _loaders(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in LOADERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--loaders {text!r}: choose a comma-separated subset of {','.join(LOADERS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arena", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small dataset and windows of a second or two")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS), metavar="SCENARIO")
    parser.add_argument("--loaders", type=_loaders, default=LOADERS, help="comma-separated: ours,reference,tensorstore")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"arena.json/arena.md go here ({DEFAULT_OUT})")
    parser.add_argument("--data", type=Path, default=None, help="the dataset's cache (default OUT/arena-data)")
    parser.add_argument(
        "--reference-venv", type=Path, default=DEFAULT_REFERENCE_VENV, help=f"default {DEFAULT_REFERENCE_VENV}"
    )
    parser.add_argument("--reference-python", default=None, help="a Python >= 3.12 to make that venv with")
    cold = parser.add_mutually_exclusive_group()
    cold.add_argument("--cold-only", action="store_true", help="one cold pass per loader, no steady state")
    cold.add_argument("--no-cold", action="store_true", help="steady state only, no cold passes")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    results = run_arena(
        QUICK if args.quick else FULL,
        out,
        (args.data or out / "arena-data").resolve(),
        only=tuple(args.only),
        loaders=args.loaders,
        ref_venv=args.reference_venv.resolve(),
        ref_python=args.reference_python,
        cold=not args.no_cold,
        cold_only=args.cold_only,
    )
    print()
    print(markdown(results))
    print(f"wrote {out / 'arena.json'} and {out / 'arena.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
