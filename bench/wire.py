"""The wire clients side by side: client CPU per GET, and samples/s at 0 ms and on the tailed 40 ms link, in one run.

``python -m bench.wire [--quick] [--rounds N] [--clients engine obstore] [--out DIR]``

Clients: ``engine`` (the engine's own HTTP client: whatever
``insitubatch/_wire`` holds when this runs; the output names the commit and
whether ``_wire`` had uncommitted changes), ``engine-040369f`` (the same
client as it was before redirects, ranges and TLS were checked: its four modules taken from
git at run time into the output folder, nothing vendored) and ``obstore``
(obstore's client, retry-free, as the engine calls it). A libcurl wire was
measured here too and left the package (docs/wire.md has its numbers; it
is in git history at da6a720, ``insitubatch/_wire/curl*.py``).

Data: ERA5-like fields from ``insitubatch.testing.data`` (float32 181 x 360,
chunks of 8 x 91 x 180, blosc-zstd), served by two
:class:`~insitubatch.testing.emulator.EmulatorProcess` (a child process, so
the server's CPU is not the client's): one with no latency, one with
``bench.network``'s tail link (40 ms + an exponential tail of 20 ms mean).
Each client is measured in a fresh child process, clients interleaved round
after round, on the same keys in the same order and the same passes:

``cpu_us_per_get``
    every stored chunk GET ``GET_REPEATS`` times, ``GET_CONCURRENCY`` at a
    time, straight through the client (no decode): the process's CPU
    (``resource.getrusage``, every thread) over the GETs.
``rate_0ms`` / ``rate_tail``
    samples/s of whole ``InSituDataset`` passes (default knobs) after one
    warm-up pass, and the process's CPU per sample.

A table goes to stdout and everything to ``DIR/wire.json`` (default ``bench/out``).

``python -m bench.wire --cpu-per-sample [--quick] [--rounds N] [--profile]``
    the network path's cost against local files': per round, one child per
    reader (``local``: the same files read as a path; ``engine``; ``obstore``),
    interleaved, each timing whole passes at default knobs over the 0 ms
    emulator after a warm-up pass; the median CPU µs per sample of each and
    its ratio to local's (the issue's targets: HTTP <= 1.2x, obstore <= 1.4x).
    ``--profile`` also writes a cProfile of zarr's loop thread over the timed
    passes of each reader's first round to ``DIR/loop-<reader>.prof``.
    Everything goes to ``DIR/cpu.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from insitubatch.testing.data import DatasetSpec, era5_181x360, write_era5_like
from insitubatch.testing.emulator import EmulatorProcess

__all__ = ["CLIENTS", "main", "measure_client"]

# The engine's client before its wire checks (redirects, ranges, TLS) were added, measured beside today's.
BASELINE_COMMIT = "040369f"
BASELINE = f"engine-{BASELINE_COMMIT}"
BASELINE_MODULES = ("__init__", "backends", "engine_client", "http", "sigv4")
CLIENTS = ("engine", BASELINE, "obstore")
# The readers of the CPU-per-sample comparison: local files (the same data as a path) first, the yardstick.
LOCAL = "local"
CPU_READERS = (LOCAL, "engine", "obstore")
# ERA5 at 1 degree: 181 x 360 float32, each 8-step chunk stored as 2 x 2 tiles of 91 x 180, blosc-zstd.
N_TIME = {"full": 384, "quick": 128}
# GETs in flight for the CPU-per-GET replay: the fixed value the engine used before "auto" (bench.network's PINNED).
GET_CONCURRENCY = 32
GET_REPEATS = {"full": 3, "quick": 1}
# Seconds of timed passes after the warm-up pass (whole passes: at least one, then until this much has passed).
PASS_WINDOW_S = {"full": 4.0, "quick": 1.0}
ROUNDS = {"full": 2, "quick": 1}
BATCH_SIZE = 16
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)  # bench.rows' split: the passes read the train split
# A child that takes longer than this has hung.
CHILD_TIMEOUT_S = 240.0
DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def spec(profile: str) -> DatasetSpec:
    """The realistic fields (the generator's ERA5 preset) at this profile's length."""
    return era5_181x360(N_TIME[profile])


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- in the child: one client -------------------------------------------------------------------------------------
def _use(client: str, store: Any, baseline: str | None = None) -> Any:
    """Make the engine read ``store`` through ``client``; returns the backend (the store's engine client holds it).

    ``baseline``: the folder holding the old client's package (``engine-040369f``).
    """
    from insitubatch._wire.backends import ObstoreBackend

    if client == LOCAL:
        return None  # local files: the store's own reader, nothing to swap
    reader = store.reader()  # the reader the store carries: the engine's client_for takes its backend
    default = reader.backend
    twin = default.raw  # every obstore-backed backend keeps the retry-free twin
    if client == "engine":
        if type(default) is ObstoreBackend:
            raise RuntimeError(f"the engine's client does not take {store!r}: it fell back to obstore")
        return default
    if client == BASELINE:
        import importlib

        assert baseline is not None
        sys.path.insert(0, baseline)
        old = importlib.import_module(f"{_baseline_package()}.engine_client")
        backend = old.native_backend(store.store, twin)
        if backend is None:
            raise RuntimeError(f"the {BASELINE_COMMIT} client does not take {store!r}")
        close_old = backend.close
        backend.close = lambda wait_s=0.0: close_old()  # today's store closer passes wait_s; the old close() had none
    else:
        backend = ObstoreBackend(twin, own_retries=False)
    close = getattr(default, "close", None)
    if close is not None:
        close()
    reader.backend = backend
    return backend


def _keys(data: Path, name: str) -> list[str]:
    """Every stored chunk of the dataset, relative to it, in one fixed order."""
    base = data / name
    keys = [str(p.relative_to(base)) for p in base.rglob("c*") if p.is_file() and p.name != "zarr.json"]
    return sorted(keys)


def _baseline_package() -> str:
    return f"wire_{BASELINE_COMMIT}"


def _extract_baseline(out: Path) -> str | None:
    """The old client's modules, from git, as a package under ``out``; the folder to import it from (None: no git)."""
    folder = out / f"wire-{BASELINE_COMMIT}"
    package = folder / _baseline_package()
    package.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    for name in BASELINE_MODULES:
        path = f"insitubatch/_wire/{name}.py"
        try:
            text = subprocess.run(
                ["git", "show", f"{BASELINE_COMMIT}:{path}"], cwd=repo, capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        (package / f"{name}.py").write_text(text)
    return str(folder)


def _gets(client: str, url: str, keys: list[str], repeats: int, baseline: str | None) -> dict[str, Any]:
    from insitubatch.stores.obstore_stores import obstore_store
    from insitubatch.stores.owned import close_store

    store = obstore_store(url, read_only=True)
    backend = _use(client, store, baseline)

    async def replay() -> tuple[int, int, float, float]:
        semaphore = asyncio.Semaphore(GET_CONCURRENCY)

        async def one(key: str) -> int:
            async with semaphore:
                return len(await backend.request(key))

        await asyncio.gather(*(one(k) for k in keys[: 2 * GET_CONCURRENCY]))  # connections opened, not timed
        cpu0, t0 = _cpu_s(), time.perf_counter()
        sizes = await asyncio.gather(*(one(k) for k in keys * repeats))
        return len(sizes), sum(sizes), _cpu_s() - cpu0, time.perf_counter() - t0

    gets, nbytes, cpu, wall = asyncio.run(replay())
    close_store(store)
    return {"gets": gets, "mb": nbytes / 1e6, "cpu_us_per_get": 1e6 * cpu / gets, "gets_per_s": gets / wall}


def _loop_profile(path: str | None) -> Any:
    """Start a cProfile of zarr's loop thread (None: no profile); returns a function that stops it and saves it."""
    if path is None:
        return lambda: None
    import cProfile
    import threading

    from zarr.core.sync import _get_loop

    loop, prof = _get_loop(), cProfile.Profile()

    def on_loop(work: Any) -> None:
        done = threading.Event()
        loop.call_soon_threadsafe(lambda: (work(), done.set()))
        done.wait()

    on_loop(prof.enable)  # (a profile covers the thread that enables it)

    def stop() -> None:
        on_loop(prof.disable)
        prof.dump_stats(path)

    return stop


def _passes(
    client: str, url: str, variables: list[str], window_s: float, baseline: str | None, profile: str | None = None
) -> dict[str, Any]:
    from insitubatch.dataset import InSituDataset
    from insitubatch.io.group import open_geometries
    from insitubatch.plan.splits import split_by_chunk
    from insitubatch.stores.obstore_stores import obstore_store
    from insitubatch.stores.owned import close_store

    store = obstore_store(url, read_only=True)
    geoms = open_geometries(store, variables=variables)
    _use(client, store, baseline)
    manifest = split_by_chunk(next(iter(geoms.values())), fractions=SPLIT_FRACTIONS)
    samples = passes = 0
    seen = {"hedged": 0, "stalls": 0, "retries": 0, "inflight_median": 0}

    def one_pass(seed: int) -> int:
        # a fresh dataset each pass: a cold pool, so every chunk comes over the wire (the link's state stays)
        with InSituDataset(store, manifest, geoms, batch_size=BATCH_SIZE, seed=seed) as ds:
            it = iter(ds.train)
            n = sum(len(batch.sample_indices) for batch in it)
            for name in ("hedged", "stalls", "retries"):
                seen[name] += getattr(it.stats, name)
            seen["inflight_median"] = it.stats.inflight_median
            return n

    one_pass(0)  # the warm-up: connections, the link's latency and the auto window
    for name in seen:
        seen[name] = 0
    stop_profile = _loop_profile(profile)
    sys0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    cpu0, t0 = _cpu_s(), time.perf_counter()
    while passes == 0 or time.perf_counter() - t0 < window_s:
        passes += 1
        samples += one_pass(passes)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    sys_s = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0
    stop_profile()
    close_store(store)
    return {
        "samples": samples,
        "passes": passes,
        "samples_per_s": samples / wall,
        "cpu_us_per_sample": 1e6 * cpu / samples,
        "sys_us_per_sample": 1e6 * sys_s / samples,  # of which in the kernel (sockets, files, threads waking)
        **seen,  # what the passes' reads met: duplicates, stalls, retries, the reads-in-flight limit
    }


def measure_client(cfg: dict[str, Any]) -> dict[str, Any]:
    """One client's three measurements (run in a fresh process by the parent)."""
    client = cfg["client"]
    row: dict[str, Any] = {"client": client}
    t0 = time.perf_counter()
    if cfg.get("cpu_only"):  # the CPU-per-sample comparison: passes at 0 ms only (or over the files, for local)
        url = cfg["path"] if client == LOCAL else cfg["url_0ms"]
        try:
            row["rate_0ms"] = _passes(client, url, cfg["variables"], cfg["window_s"], None, cfg.get("profile"))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        row["elapsed_s"] = time.perf_counter() - t0
        return row
    try:
        baseline = cfg.get("baseline")
        row.update(_gets(client, cfg["url_0ms"], cfg["keys"], cfg["repeats"], baseline))
        row["rate_0ms"] = _passes(client, cfg["url_0ms"], cfg["variables"], cfg["window_s"], baseline)
        row["rate_tail"] = _passes(client, cfg["url_tail"], cfg["variables"], cfg["window_s"], baseline)
    except Exception as exc:  # a client that cannot run here is a row with its error
        row["error"] = f"{type(exc).__name__}: {exc}"
    row["elapsed_s"] = time.perf_counter() - t0
    return row


# -- in the parent --------------------------------------------------------------------------------------------------
def _revision() -> dict[str, Any]:
    """The commit measured, and whether the engine's client (``insitubatch/_wire``) differs from it."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--", "insitubatch/_wire")
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown", "wire_uncommitted": dirty.splitlines()}


def _versions() -> dict[str, str]:
    import obstore

    return {"python": sys.version.split()[0], "obstore": getattr(obstore, "__version__", "?")}


def _child(cfg: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.wire", "--child", json.dumps(cfg)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"client": cfg["client"], "error": f"child exited {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])


def _median(rows: list[dict[str, Any]], *path: str) -> float:
    values = []
    for row in rows:
        value: Any = row
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return statistics.median(values) if values else math.nan


def summarize(rows: list[dict[str, Any]], clients: list[str]) -> dict[str, dict[str, float]]:
    """Per client, the median over rounds of each number."""
    out = {}
    for client in clients:
        mine = [r for r in rows if r.get("client") == client and "error" not in r]
        out[client] = {
            "cpu_us_per_get": _median(mine, "cpu_us_per_get"),
            "gets_per_s": _median(mine, "gets_per_s"),
            "samples_per_s_0ms": _median(mine, "rate_0ms", "samples_per_s"),
            "cpu_us_per_sample_0ms": _median(mine, "rate_0ms", "cpu_us_per_sample"),
            "samples_per_s_tail": _median(mine, "rate_tail", "samples_per_s"),
            "cpu_us_per_sample_tail": _median(mine, "rate_tail", "cpu_us_per_sample"),
            "rounds": len(mine),
        }
    return out


def table(summary: dict[str, dict[str, float]]) -> str:
    def f(value: float, digits: int = 0) -> str:
        return "—" if math.isnan(value) else f"{value:,.{digits}f}"

    lines = [
        "| client | CPU µs/GET | GETs/s (32 in flight) | samples/s 0 ms | CPU µs/sample 0 ms | samples/s 40 ms tail "
        "| CPU µs/sample tail | rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for client, s in summary.items():
        lines.append(
            f"| {client} | {f(s['cpu_us_per_get'])} | {f(s['gets_per_s'])} | {f(s['samples_per_s_0ms'])} "
            f"| {f(s['cpu_us_per_sample_0ms'])} | {f(s['samples_per_s_tail'])} | {f(s['cpu_us_per_sample_tail'])} "
            f"| {s['rounds']} |"
        )
    return "\n".join(lines)


def run(profile: str, clients: list[str], rounds: int, out: Path) -> dict[str, Any]:
    from bench.scenarios import TAIL_LINK  # the tail scenario's link, so the numbers compare with bench.network's

    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "wire-data"
    data.mkdir(exist_ok=True)
    dataset = spec(profile)
    write_era5_like(data / dataset.name, dataset)
    keys = _keys(data, dataset.name)
    revision = _revision()
    print(
        f"bench.wire: commit {revision['commit']}"
        + (" (+ uncommitted _wire changes)" if revision["wire_uncommitted"] else "")
    )
    print(
        f"  {dataset.name}: {len(keys)} stored chunks, {sum((data / dataset.name / k).stat().st_size for k in keys) / 1e6:.0f} MB"
    )
    rows: list[dict[str, Any]] = []
    with EmulatorProcess(data, latency_s=0.0, jitter_s=0.0) as flat, EmulatorProcess(data, **TAIL_LINK) as tail:
        base = {
            "url_0ms": flat.url_for(dataset.name),
            "url_tail": tail.url_for(dataset.name),
            "keys": keys,
            "repeats": GET_REPEATS[profile],
            "variables": list(dataset.variables),
            "window_s": PASS_WINDOW_S[profile],
            "baseline": _extract_baseline(out) if BASELINE in clients else None,
        }
        for r in range(rounds):
            order = clients if r % 2 == 0 else clients[::-1]  # alternated: a slow moment falls on every client
            for client in order:
                row = _child({**base, "client": client})
                row["round"] = r + 1
                rows.append(row)
                shown = row.get("error") or (
                    f"{row['cpu_us_per_get']:.0f} µs/GET, {row['rate_0ms']['samples_per_s']:.0f} samples/s at 0 ms, "
                    f"{row['rate_tail']['samples_per_s']:.0f} on the tail link"
                )
                print(f"  round {r + 1} {client}: {shown} ({row.get('elapsed_s', 0):.0f} s)")
    summary = summarize(rows, clients)
    result = {
        "profile": profile,
        "dataset": dataset.name,
        "stored_chunks": len(keys),
        "link_tail": TAIL_LINK,
        "get_concurrency": GET_CONCURRENCY,
        "revision": revision,
        "versions": _versions(),
        "rows": rows,
        "summary": summary,
        "elapsed_s": time.perf_counter() - t_start,
    }
    (out / "wire.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def run_cpu(profile: str, rounds: int, out: Path, loop_profile: bool) -> dict[str, Any]:
    """CPU per sample of passes at 0 ms through each of ``CPU_READERS``, interleaved round after round."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "wire-data"
    data.mkdir(exist_ok=True)
    dataset = spec(profile)
    write_era5_like(data / dataset.name, dataset)
    revision = _revision()
    print(f"bench.wire --cpu-per-sample: commit {revision['commit']}, {dataset.name}")
    rows: list[dict[str, Any]] = []
    readers = list(CPU_READERS)
    with EmulatorProcess(data, latency_s=0.0, jitter_s=0.0) as flat:
        base = {
            "cpu_only": True,
            "path": str(data / dataset.name),
            "url_0ms": flat.url_for(dataset.name),
            "variables": list(dataset.variables),
            "window_s": PASS_WINDOW_S[profile],
        }
        for r in range(rounds):
            for client in readers if r % 2 == 0 else readers[::-1]:
                prof = str(out / f"loop-{client}.prof") if loop_profile and r == 0 else None
                row = _child({**base, "client": client, "profile": prof})
                row["round"] = r + 1
                rows.append(row)
                shown = row.get("error") or (
                    f"{row['rate_0ms']['cpu_us_per_sample']:.0f} µs/sample "
                    f"({row['rate_0ms']['sys_us_per_sample']:.0f} in the kernel), "
                    f"{row['rate_0ms']['samples_per_s']:.0f} samples/s"
                )
                print(f"  round {r + 1} {client}: {shown}")
    summary: dict[str, dict[str, float]] = {}
    for client in readers:
        mine = [row for row in rows if row.get("client") == client and "error" not in row]
        summary[client] = {
            "cpu_us_per_sample": _median(mine, "rate_0ms", "cpu_us_per_sample"),
            "sys_us_per_sample": _median(mine, "rate_0ms", "sys_us_per_sample"),
            "samples_per_s": _median(mine, "rate_0ms", "samples_per_s"),
            "rounds": len(mine),
        }
    local = summary[LOCAL]["cpu_us_per_sample"]
    for s in summary.values():
        s["vs_local"] = s["cpu_us_per_sample"] / local
    result = {"profile": profile, "dataset": dataset.name, "revision": revision, "rows": rows, "summary": summary}
    (out / "cpu.json").write_text(json.dumps(result, indent=2, default=str))
    print(
        "\n| reader | CPU µs/sample 0 ms | of which kernel | x local | samples/s | rounds |"
        "\n|---|---:|---:|---:|---:|---:|"
    )
    for client, s in summary.items():
        print(
            f"| {client} | {s['cpu_us_per_sample']:.0f} | {s['sys_us_per_sample']:.0f} | {s['vs_local']:.2f} "
            f"| {s['samples_per_s']:.0f} "
            f"| {s['rounds']} |"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wire", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller dataset, one round, short windows")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every client (default 2, quick 1)")
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cpu-per-sample", action="store_true", help="CPU per sample: local files, engine, obstore")
    parser.add_argument("--profile", action="store_true", help="with --cpu-per-sample: cProfile the loop thread")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_client(json.loads(args.child))))
        return 0
    profile = "quick" if args.quick else "full"
    if args.cpu_per_sample:
        run_cpu(profile, args.rounds or ROUNDS[profile], args.out.resolve(), args.profile)
        return 0
    result = run(profile, args.clients, args.rounds or ROUNDS[profile], args.out.resolve())
    print()
    print(table(result["summary"]))
    print(f"\n{result['elapsed_s']:.0f} s; {args.out.resolve() / 'wire.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
