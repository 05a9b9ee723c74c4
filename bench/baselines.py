"""The loaders the report measures, each run alone in a fresh child process.

``python -m bench.baselines '<json config>'`` (or :func:`main`) runs one
measurement and prints one line ``RESULT {json}``; :func:`run_config` runs
it in the calling process instead (the quick profile does, to pay the
imports once). A fresh interpreter per run keeps the
measurements apart: peak RSS is this run's own (the child and its workers,
never a previous loader's heap), each TTFB starts from a process with its
imports done but nothing opened, and a hung loader is killed without taking
the report with it. The parent (``bench.run``) resets the emulator's
counters before each run and reads them after.

Loaders (``config["loader"]``):

``dataloader``
    ``torch.utils.data.DataLoader`` over :class:`PerSampleZarrDataset`, a
    map-style dataset whose ``__getitem__`` reads one sample of every
    variable with zarr-python through obstore, the store opened lazily in
    each worker process; ``num_workers`` and ``start_method`` from the config.
``fork_probe``
    The same dataset handed to ``fork`` workers, in three variants (see
    :func:`_run_fork_probe`); reports whether a first batch arrives before a
    hard timeout (a finding, not a throughput row).
``xbatcher``
    ``xr.open_zarr`` + ``xbatcher.BatchGenerator`` (contiguous time batches)
    + ``xbatcher.loaders.torch.MapDataset`` in a DataLoader, batch order
    shuffled.
``zarr``
    Plain zarr-python reading contiguous batches in order (a sequential best case).
``insitu``
    ``InSituDataset`` cold: a fresh dataset, automatic budget.
``insitu_warm``
    A dataset whose pool holds the whole split: one epoch to fill it, then
    the measured epoch served from memory.
``insitu_persist``
    With ``cache_dir`` and ``persist=True`` (only when ``InSituDataset``
    accepts them): ``phase`` ``"fill"`` writes the cache, ``"warm"`` reads it
    in a new process.
``insitu_steady``
    One dataset, passes back to back: ``warmup_s`` seconds untimed (the
    self-tuning window settles), then ``window_s`` seconds timed, with the
    process's CPU per sample and the last pass's reads-in-flight stats
    (``bench.network``).
``decode_ceiling``
    The split's stored chunks, read from disk into memory, decoded with
    ``insitubatch.io.decode.make_decoder`` on a thread pool of every core.
``get_ceiling``
    The split's stored-chunk GETs alone, ``concurrency`` at a time, through
    obstore, no decode.

Every row has three rates: ``samples_per_s`` from the very start (store
opened, nothing built) to the last batch; ``pass_samples_per_s`` from the
moment the loader was built and iterating; ``steady_samples_per_s`` from
the first batch on, ended on a whole round of worker batches (see
:func:`_measure`). The report compares ``rate_samples_per_s``: the steady
rate for the baselines (their start-up left out, in their favour) and the
pass rate for insitubatch (its pipeline fill counted, against it).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RESULT_PREFIX",
    "PeakRSS",
    "PerSampleZarrDataset",
    "data_key_predicate",
    "main",
    "run_config",
    "supports_persist",
]

RESULT_PREFIX = "RESULT "
# The process tree is sampled this often for peak RSS.
RSS_SAMPLE_S = 0.02
MB = 1e6
# The decode ceiling repeats the split's decode at least this often and this
# long, and keeps the best round (a 2-core box is noisy).
CEILING_MIN_ROUNDS = 3
CEILING_MIN_S = 1.0
# Metadata keys that are not chunk data (zarr v2 and v3).
_METADATA_NAMES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")


# -- measurement -----------------------------------------------------------------------
def _proc_children(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc`` (Linux; empty where unavailable)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _proc_rss(pid: int) -> int:
    """Resident bytes of ``pid`` from ``/proc/<pid>/statm`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class PeakRSS:
    """Samples the RSS of this process and all its descendants; keeps the peak (bytes).

    The sum counts pages shared between processes once per process (an
    upper bound on the tree's footprint), as ``ps`` would. Descendants of an
    excluded pid (an emulator this process started) are left out. Reads
    ``/proc`` directly (Linux), so it needs no extra package.
    """

    def __init__(self, interval_s: float = RSS_SAMPLE_S, exclude_pids: Sequence[int] = ()) -> None:
        self.interval_s = interval_s
        self._exclude = set(exclude_pids)
        self.peak = 0
        self.base = _proc_rss(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def tree(self) -> list[int]:
        """This process and its descendants, minus excluded subtrees."""
        pids, todo = [], [os.getpid()]
        while todo:
            pid = todo.pop()
            if pid in self._exclude:
                continue
            pids.append(pid)
            todo += _proc_children(pid)
        return pids

    def sample(self) -> int:
        total = sum(_proc_rss(pid) for pid in self.tree())
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakRSS:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass
class Measurement:
    """What one loader run delivered, before the parent adds the server's counters."""

    samples: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    ttfb_s: float = float("nan")
    iter_s: float = 0.0  # when the loader was built and iterating (setup done)
    last_s: float = 0.0  # when the last batch arrived
    steady_samples: int = 0
    steady_s: float = 0.0
    consumed: list[np.ndarray] = field(default_factory=list)
    complete: bool = False

    def indices(self) -> np.ndarray:
        return np.concatenate(self.consumed) if self.consumed else np.empty(0, dtype=np.int64)


def _measure(
    start: Callable[[], Iterator[Any]],
    indices_of: Callable[[Any], np.ndarray],
    *,
    window_s: float,
    round_batches: int = 1,
    max_batches: int | None = None,
) -> Measurement:
    """Time a loader: ``start()`` builds it (clock running) and returns its batch iterator.

    The run ends at the end of the epoch, after ``max_batches``, or once
    ``window_s`` has passed since the first batch — checked only when a whole
    number of ``round_batches`` followed the first batch, because ``W``
    workers deliver their batches in bursts of ``W`` and a cut inside a burst
    would overstate the rate.
    """
    m = Measurement()
    t0 = time.perf_counter()
    it = start()
    m.iter_s = time.perf_counter() - t0
    t_first = None
    try:
        for batch in it:
            now = time.perf_counter()
            idx = np.asarray(indices_of(batch), dtype=np.int64)
            m.consumed.append(idx)
            m.samples += len(idx)
            m.batches += 1
            m.last_s = now - t0
            if t_first is None:
                t_first = now
                m.ttfb_s = now - t0
                first_samples = len(idx)
            else:
                m.steady_samples = m.samples - first_samples
                m.steady_s = now - t_first
            after_first = m.batches - 1
            if max_batches is not None and m.batches >= max_batches:
                break
            if after_first > 0 and after_first % round_batches == 0 and now - t_first >= window_s:
                break
        else:
            m.complete = True
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it
    m.elapsed_s = time.perf_counter() - t0
    return m


# -- shared helpers ---------------------------------------------------------------------
def data_key_predicate(dataset: str, variables: Sequence[str]) -> Callable[[str], bool]:
    """``key -> bool``: is ``key`` (a server path) a chunk of one of ``variables`` of ``dataset``?"""
    prefixes = tuple(f"{dataset.strip('/')}/{v}/" for v in variables)

    def is_data(key: str) -> bool:
        return key.startswith(prefixes) and not key.endswith(_METADATA_NAMES)

    return is_data


def _open_store(url: str) -> Any:
    from insitubatch.io.stores import obstore_store

    return obstore_store(url, read_only=True)


def _geometries(store: Any, variables: Sequence[str]) -> dict[str, Any]:
    from insitubatch.io.group import open_geometries

    return open_geometries(store, variables=list(variables))


def _train_indices(geoms: dict[str, Any], fractions: Sequence[float]) -> np.ndarray:
    """The train split's sample indices — the same split insitubatch iterates."""
    from insitubatch.plan.splits import split_by_chunk

    manifest = split_by_chunk(next(iter(geoms.values())), fractions=tuple(fractions))
    return manifest.sample_indices("train")


def _min_gets(indices: np.ndarray, geoms: dict[str, Any]) -> int:
    """Distinct stored chunks (tiles) the samples ``indices`` touch: the fewest GETs that read them."""
    total = 0
    for g in geoms.values():
        total += len(np.unique(indices // g.sample_chunk_size)) * g.tiles_per_chunk
    return int(total)


def _sample_nbytes(geoms: dict[str, Any]) -> int:
    return int(sum(g.sample_nbytes for g in geoms.values()))


def _tile_keys(geoms: dict[str, Any], indices: np.ndarray) -> list[tuple[Any, tuple[int, ...], str]]:
    """``(geometry, coord, key)`` of every stored chunk the samples ``indices`` touch, in chunk order."""
    out = []
    for g in geoms.values():
        for c in np.unique(indices // g.sample_chunk_size).tolist():
            for t in range(g.tiles_per_chunk):
                coord = g.physical_chunk_coord(int(c), t)
                out.append((g, coord, g.chunk_key(coord)))
    return out


# -- per-sample DataLoader baseline ------------------------------------------------------
class PerSampleZarrDataset:
    """Map-style dataset: ``ds[i]`` is sample ``i`` of every variable, read with zarr-python.

    The store is opened lazily in whichever process calls ``__getitem__``
    (so each DataLoader worker opens its own), unless ``reopen_in_worker`` is
    False, in which case a store opened in the parent is used as inherited —
    what the fork probe needs. Plain object with ``__len__``/``__getitem__``:
    DataLoader takes it without importing torch here.
    """

    def __init__(self, url: str, variables: Sequence[str], n_samples: int, *, reopen_in_worker: bool = True) -> None:
        self.url = url
        self.variables = tuple(variables)
        self.n_samples = int(n_samples)
        self.reopen_in_worker = reopen_in_worker
        self._arrays: list[Any] | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.reopen_in_worker:  # spawn/forkserver pickle the dataset: never ship open handles
            state["_arrays"], state["_pid"] = None, None
        return state

    def _open(self) -> list[Any]:
        if self._arrays is None or (self.reopen_in_worker and self._pid != os.getpid()):
            import zarr

            group = zarr.open_group(_open_store(self.url), mode="r")
            self._arrays = [group[v] for v in self.variables]
            self._pid = os.getpid()
        return self._arrays

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, i: int) -> dict[str, Any]:
        # one variable after another, as a hand-written __getitem__ does
        sample = {v: a[int(i)] for v, a in zip(self.variables, self._open())}
        sample["index"] = int(i)
        return sample


def _dataloader(cfg: dict[str, Any], dataset: Any, sampler: Any, **extra: Any) -> Any:
    import torch.utils.data

    workers = int(cfg.get("num_workers", 0))
    options: dict[str, Any] = {}
    if workers > 0:
        options["multiprocessing_context"] = cfg.get("start_method", "spawn")
        options["persistent_workers"] = False
    return torch.utils.data.DataLoader(dataset, num_workers=workers, sampler=sampler, **options, **extra)


def _run_dataloader(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    store = _open_store(cfg["url"])
    geoms = _geometries(store, cfg["variables"])
    train = _train_indices(geoms, cfg["fractions"])
    n = next(iter(geoms.values())).n_samples
    del store  # the workers open their own

    def start() -> Iterator[Any]:
        dataset = PerSampleZarrDataset(cfg["url"], cfg["variables"], n)
        generator = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
        sampler = torch.utils.data.SubsetRandomSampler(train.tolist(), generator=generator)
        return iter(_dataloader(cfg, dataset, sampler, batch_size=int(cfg["batch_size"])))

    m = _measure(
        start,
        lambda b: b["index"].numpy(),
        window_s=float(cfg["window_s"]),
        round_batches=max(1, int(cfg.get("num_workers", 0))),
        max_batches=cfg.get("max_batches"),
    )
    return _result(cfg, m, geoms)


# -- fork probe ----------------------------------------------------------------------------
FORK_VARIANTS = ("inherit", "reopen", "clean")


def _run_fork_probe(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ask ``fork`` workers for one batch under a hard timeout; the outcome is the finding.

    ``variant`` (one of :data:`FORK_VARIANTS`):

    ``inherit``
        the parent opens the store and reads a sample; the workers use that
        open store as inherited across the fork;
    ``reopen``
        the parent reads as above; each worker opens a new store after the fork;
    ``clean``
        the parent never touches the store (``n_samples`` comes from the
        config); each worker opens its own.

    On timeout the workers are killed by pid and the outcome is ``"hang"``.
    """
    import torch

    variant = cfg["variant"]
    if variant not in FORK_VARIANTS:
        raise ValueError(f"variant={variant!r} must be one of {FORK_VARIANTS}")
    timeout = float(cfg["timeout_s"])
    dataset = PerSampleZarrDataset(
        cfg["url"], cfg["variables"], int(cfg["n_samples"]), reopen_in_worker=variant != "inherit"
    )
    if variant != "clean":
        dataset[0]  # the parent reads: obstore's runtime and zarr's loop are now live in this process
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        t0 = time.perf_counter()
        try:
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=int(cfg["batch_size"]), num_workers=2, multiprocessing_context="fork"
            )
            batch = next(iter(loader))
            outcome.update(outcome="ok", seconds=time.perf_counter() - t0, samples=len(batch["index"]))
        except Exception as exc:  # what fork does is the finding
            outcome.update(
                outcome="raised", seconds=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:500]
            )

    thread = threading.Thread(target=attempt, name="fork-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        workers = PeakRSS().tree()[1:]
        outcome.update(outcome="hang", seconds=timeout, workers=len(workers))
        for pid in workers:  # our own DataLoader workers, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return {"name": cfg["name"], "loader": "fork_probe", "variant": variant, "timeout_s": timeout, **outcome}


# -- xbatcher baseline ----------------------------------------------------------------------
class _StackVariables:
    """xbatcher transform: a batch Dataset → ``(batch, variable, lat, lon)`` tensor (picklable)."""

    def __init__(self, variables: Sequence[str]) -> None:
        self.variables = tuple(variables)

    def __call__(self, batch: Any) -> Any:
        import torch

        return torch.from_numpy(np.stack([batch[v].values for v in self.variables], axis=1))


class _XbatcherItems:
    """Wraps xbatcher's MapDataset so each item also says which samples it holds."""

    def __init__(self, inner: Any, starts: np.ndarray, batch_size: int, stop: int) -> None:
        self.inner, self.starts, self.batch_size, self.stop = inner, starts, batch_size, stop

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import torch

        start = int(self.starts[i])
        return self.inner[i], torch.arange(start, min(start + self.batch_size, self.stop))


def _run_xbatcher(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import xarray as xr
    import xbatcher
    from xbatcher.loaders.torch import MapDataset

    store = _open_store(cfg["url"])
    geoms = _geometries(store, cfg["variables"])
    train = _train_indices(geoms, cfg["fractions"])
    lo, hi = int(train.min()), int(train.max()) + 1
    bs = int(cfg["batch_size"])
    g0 = next(iter(geoms.values()))
    inner = dict(zip(("lat", "lon"), g0.inner_shape))
    chunks = cfg.get("xarray_chunks")  # None: lazy zarr arrays, no dask; {}: one dask chunk per zarr chunk

    def start() -> Iterator[Any]:
        ds = xr.open_zarr(_open_store(cfg["url"]), chunks=chunks)[list(cfg["variables"])].isel(time=slice(lo, hi))
        gen = xbatcher.BatchGenerator(ds, input_dims=inner, batch_dims={"time": bs}, concat_input_dims=False)
        items = _XbatcherItems(
            MapDataset(gen, transform=_StackVariables(cfg["variables"])), np.arange(lo, hi, bs), bs, hi
        )
        generator = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
        sampler = torch.utils.data.RandomSampler(items, generator=generator)
        return iter(_dataloader(cfg, items, sampler, batch_size=None))

    m = _measure(
        start,
        lambda b: b[1].numpy(),
        window_s=float(cfg["window_s"]),
        round_batches=max(1, int(cfg.get("num_workers", 0))),
        max_batches=cfg.get("max_batches"),
    )
    return _result(cfg, m, geoms)


# -- plain zarr baseline ---------------------------------------------------------------------
def _run_zarr(cfg: dict[str, Any]) -> dict[str, Any]:
    import zarr

    store = _open_store(cfg["url"])
    geoms = _geometries(store, cfg["variables"])
    train = _train_indices(geoms, cfg["fractions"])
    lo, hi = int(train.min()), int(train.max()) + 1
    bs = int(cfg["batch_size"])

    def start() -> Iterator[Any]:
        group = zarr.open_group(_open_store(cfg["url"]), mode="r")
        arrays = [group[v] for v in cfg["variables"]]
        for s in range(lo, hi, bs):
            e = min(s + bs, hi)
            yield [a[s:e] for a in arrays], np.arange(s, e)

    m = _measure(start, lambda b: b[1], window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    return _result(cfg, m, geoms)


# -- insitubatch ---------------------------------------------------------------------------
def _insitu_dataset(cfg: dict[str, Any], store: Any, geoms: dict[str, Any], **extra: Any) -> Any:
    from insitubatch.dataset import InSituDataset
    from insitubatch.plan.splits import split_by_chunk

    manifest = split_by_chunk(next(iter(geoms.values())), fractions=tuple(cfg["fractions"]))
    knobs = {
        k: cfg[k]
        for k in ("max_inflight", "block_chunks", "prefetch_depth", "decode_threads", "hedge")
        if cfg.get(k) is not None
    }
    return InSituDataset(
        store, manifest, geoms, batch_size=int(cfg["batch_size"]), seed=int(cfg.get("seed", 0)), **knobs, **extra
    )


def _insitu_bounds(ds: Any, plan: Any) -> dict[str, Any]:
    """The memory the engine may hold by design: budget + queue + in-flight (the RSS bar's terms)."""
    g = ds.variables
    batch_bytes = ds.batch_size * sum(v.sample_nbytes for v in g.values())
    tile = max(v.stored_chunk_nbytes for v in g.values())
    ahead = ds.context.read_ahead(plan)[0]  # max_inflight="auto" on a remote store reads further ahead
    return {
        "working_set_mb": plan.working_set_bytes / MB,
        "budget_mb": (ds.pool.explicit_budget or plan.working_set_bytes + ahead) / MB,
        "queue_mb": (ds.prefetch_depth + 2) * batch_bytes / MB,  # queued + the one being gathered + the consumer's
        # encoded + decoded, as an upper bound; under max_inflight="auto" at its cap
        "inflight_mb": 2 * ds.context.inflight_cap() * tile / MB,
    }


def _run_insitu(cfg: dict[str, Any]) -> dict[str, Any]:
    holder: dict[str, Any] = {}

    def start() -> Iterator[Any]:
        store = _open_store(cfg["url"])
        geoms = _geometries(store, cfg["variables"])
        ds = _insitu_dataset(cfg, store, geoms)
        holder.update(ds=ds, geoms=geoms)
        it = iter(ds.train)
        holder["it"] = it
        return it

    m = _measure(start, lambda b: b.sample_indices, window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    ds, it = holder["ds"], holder["it"]
    out = _result(cfg, m, holder["geoms"])
    out.update(_insitu_counters(it), **_insitu_bounds(ds, it.plan))
    if cfg.get("memory_probe"):
        out.update(_inspect_bound(ds, it.plan, cfg))
    ds.close()
    return out


def _inspect_bound(ds: Any, plan: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """What ``insitubatch inspect`` prints for this pass's knobs (its memory line), and the split/budget ratio."""
    import re

    from insitubatch.tools.inspect_store import inspect_store

    text = inspect_store(
        ds.store,
        batch_size=ds.batch_size,
        block_chunks=ds.block_chunks,
        max_inflight=ds.max_inflight,
        prefetch_depth=ds.prefetch_depth,
        fractions=tuple(cfg["fractions"]),
        probe=False,
    )
    bound = re.search(r"^memory\s+≈ ([\d.]+) MB", text, re.MULTILINE)
    return {
        "inspect_bound_mb": float(bound.group(1)) if bound else float("nan"),
        "split_mb": float(plan.read_nbytes.sum()) / MB,
        "split_over_budget": float(plan.read_nbytes.sum()) / max(plan.working_set_bytes, 1),
    }


def _insitu_counters(it: Any) -> dict[str, Any]:
    c = it.counters
    return {
        "insitu_gets": c.gets,
        "insitu_get_bytes": c.get_bytes,
        "hits": c.hits,
        "misses": c.misses,
        "limiting_stage": it.stats.limiting_stage,
        "inflight_median": it.stats.inflight_median,  # the reads-in-flight limit the pass ran at
        "hedged": it.stats.hedged,  # duplicate GETs the latency tail earned (the server counts them too)
    }


def _run_insitu_warm(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fill a pool that holds the split with one epoch (not timed), then time the next one."""
    store = _open_store(cfg["url"])
    geoms = _geometries(store, cfg["variables"])
    train = _train_indices(geoms, cfg["fractions"])
    split_bytes = sum(g.chunk_nbytes * len(np.unique(train // g.sample_chunk_size)) for g in geoms.values())
    budget = int(split_bytes * cfg.get("budget_factor", 1.25)) + 1
    ds = _insitu_dataset(cfg, store, geoms, cache_budget_bytes=budget)
    for _ in ds.train:
        pass
    ds.set_epoch(1)
    _reset_emulator(cfg)  # the server's counters then count the measured epoch only
    holder: dict[str, Any] = {}

    def start() -> Iterator[Any]:
        holder["it"] = it = iter(ds.train)
        return it

    m = _measure(start, lambda b: b.sample_indices, window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    out = _result(cfg, m, geoms)
    out.update(_insitu_counters(holder["it"]), cache_budget_mb=budget / MB)
    ds.close()
    return out


def _run_insitu_steady(cfg: dict[str, Any]) -> dict[str, Any]:
    """Passes of one dataset back to back; the rate and CPU per sample of a window after a warm-up."""
    from insitubatch.io.stores import obstore_store

    store = obstore_store(cfg["url"], read_only=True, **cfg.get("store_options", {}))
    geoms = _geometries(store, cfg["variables"])
    ds = _insitu_dataset(cfg, store, geoms)
    warmup, window = float(cfg.get("warmup_s", 0.0)), float(cfg["window_s"])
    t_start = time.perf_counter()
    t0 = cpu0 = None
    samples = passes = 0
    stats = None
    while t0 is None or time.perf_counter() - t0 < window:
        ds.set_epoch(passes)
        it = iter(ds.train)
        for batch in it:
            now = time.perf_counter()
            if t0 is None and now - t_start >= warmup:
                t0, cpu0 = now, _cpu_s()
            elif t0 is not None:
                samples += len(batch.sample_indices)
                if now - t0 >= window:
                    break
        stats = it.stats
        it.close()
        passes += 1
    assert stats is not None and t0 is not None and cpu0 is not None  # at least one batch came after the warm-up
    cpu = _cpu_s() - cpu0
    elapsed = time.perf_counter() - t0
    ds.close()
    return {
        "name": cfg["name"],
        "loader": "insitu_steady",
        "samples": samples,
        "elapsed_s": elapsed,
        "passes": passes,
        "rate_samples_per_s": samples / elapsed,
        "rate_basis": f"steady: {window:g} s after {warmup:g} s of passes",
        "cpu_us_per_sample": 1e6 * cpu / max(samples, 1),
        "mb_per_s": samples * _sample_nbytes(geoms) / elapsed / MB,
        "last_pass": stats.to_dict(),
    }


def _cpu_s() -> float:
    """This process's CPU seconds so far, every thread's, user and system."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _reset_emulator(cfg: dict[str, Any]) -> None:
    """Zero the emulator's counters mid-run, when the parent gave its control URL."""
    url = cfg.get("emulator_reset_url")
    if url:
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), timeout=30) as resp:
            resp.read()


def supports_persist() -> bool:
    """Whether this insitubatch's ``InSituDataset`` takes ``cache_dir`` and ``persist``."""
    from insitubatch.dataset import InSituDataset

    params = inspect.signature(InSituDataset).parameters
    return "persist" in params and "cache_dir" in params


def _run_insitu_persist(cfg: dict[str, Any]) -> dict[str, Any]:
    """``phase="fill"``: one epoch into a persisted cache; ``"warm"``: a new process reads it back."""
    holder: dict[str, Any] = {}

    def start() -> Iterator[Any]:
        store = _open_store(cfg["url"])
        geoms = _geometries(store, cfg["variables"])
        ds = _insitu_dataset(cfg, store, geoms, cache_dir=cfg["cache_dir"], persist=True)
        holder.update(ds=ds, geoms=geoms)
        holder["it"] = it = iter(ds.train)
        return it

    m = _measure(start, lambda b: b.sample_indices, window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    out = _result(cfg, m, holder["geoms"])
    out.update(_insitu_counters(holder["it"]), phase=cfg["phase"])
    holder["ds"].close()
    return out


# -- ceilings ---------------------------------------------------------------------------------
def _run_decode_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """Decode the split's stored chunks from memory on every core: the CPU's bound on the loader."""
    from insitubatch.io.decode import make_decoder

    store = _open_store(cfg["local_path"])
    geoms = _geometries(store, cfg["variables"])
    train = _train_indices(geoms, cfg["fractions"])
    root = Path(cfg["local_path"])
    tiles = [(make_decoder(g), coord, (root / key).read_bytes()) for g, coord, key in _tile_keys(geoms, train)]
    threads = int(cfg.get("threads") or os.cpu_count() or 1)
    rates = []
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="bench-decode") as pool:
        list(pool.map(lambda t: t[0](t[2], t[1]), tiles[:threads]))  # warm the decoders
        t_start = time.perf_counter()
        while len(rates) < CEILING_MIN_ROUNDS or time.perf_counter() - t_start < CEILING_MIN_S:
            t0 = time.perf_counter()
            list(pool.map(lambda t: t[0](t[2], t[1]), tiles))
            rates.append(len(train) / (time.perf_counter() - t0))
    best = max(rates)  # a ceiling: the best the cores did, not their average
    return {
        "name": cfg["name"],
        "loader": "decode_ceiling",
        "threads": threads,
        "tiles": len(tiles),
        "rounds": len(rates),
        "samples": len(train) * len(rates),
        "elapsed_s": time.perf_counter() - t_start,
        "rate_samples_per_s": best,
        "mean_samples_per_s": float(np.mean(rates)),
        "rate_basis": "decode only, best round",
        "mb_per_s": best * _sample_nbytes(geoms) / MB,
        "encoded_mb": sum(len(t[2]) for t in tiles) / MB,
    }


def _run_get_ceiling(cfg: dict[str, Any]) -> dict[str, Any]:
    """GET the split's stored chunks ``concurrency`` at a time through the loader's own client, bytes only.

    The replay is :func:`insitubatch.testing.ceiling.raw_get_ceiling`, the one
    the pytest plugin's ``loader_benchmark`` measures its ceiling with.
    """
    from insitubatch.testing.ceiling import raw_get_ceiling

    store = _open_store(cfg["url"])
    geoms = _geometries(store, cfg["variables"])
    train = _train_indices(geoms, cfg["fractions"])
    keys = [key for _, _, key in _tile_keys(geoms, train)]
    cpu0 = _cpu_s()
    ceiling = raw_get_ceiling(store, keys, int(cfg["concurrency"]), window_s=float(cfg["window_s"]))
    cpu = _cpu_s() - cpu0
    samples = len(train) * ceiling.gets / len(keys)
    return {
        "name": cfg["name"],
        "loader": "get_ceiling",
        "concurrency": ceiling.concurrency,
        "gets_done": ceiling.gets,
        "samples": samples,
        "elapsed_s": ceiling.seconds,
        "rate_samples_per_s": samples / ceiling.seconds,
        "rate_basis": "GETs only",
        # the client's CPU for the GETs alone (no decode): the floor under any loader's CPU per sample
        "cpu_us_per_sample": 1e6 * cpu / max(samples, 1),
        "gets_per_s": ceiling.gets_per_s,
        "wire_mb_per_s": ceiling.nbytes / ceiling.seconds / MB,
        "mb_per_s": samples * _sample_nbytes(geoms) / ceiling.seconds / MB,
    }


# -- result and entry point ----------------------------------------------------------------------
def _result(cfg: dict[str, Any], m: Measurement, geoms: dict[str, Any]) -> dict[str, Any]:
    nbytes = _sample_nbytes(geoms)
    steady = m.steady_samples / m.steady_s if m.steady_s > 0 else float("nan")
    pass_rate = m.samples / (m.last_s - m.iter_s) if m.last_s > m.iter_s else float("nan")
    # the rate the report compares: worker baselines from their first batch on
    # (start-up excluded, in their favour); insitubatch over its whole pass
    # from iter() (the pipeline fill included, against it)
    insitu = cfg["loader"].startswith("insitu")
    rate = pass_rate if insitu else steady
    indices = m.indices()
    return {
        "name": cfg["name"],
        "loader": cfg["loader"],
        "samples": m.samples,
        "batches": m.batches,
        "complete_epoch": m.complete,
        "elapsed_s": m.elapsed_s,
        "ttfb_s": m.ttfb_s,
        "samples_per_s": m.samples / m.elapsed_s if m.elapsed_s > 0 else float("nan"),
        "steady_samples_per_s": steady,
        "pass_samples_per_s": pass_rate,
        "rate_samples_per_s": rate,
        "rate_basis": "pass from iter()" if insitu else "steady from the first batch",
        "mb_per_s": rate * nbytes / MB,
        "min_gets": _min_gets(indices, geoms),
        "distinct_samples": int(len(np.unique(indices))),
        "sample_nbytes": nbytes,
    }


_RUNNERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "dataloader": _run_dataloader,
    "fork_probe": _run_fork_probe,
    "xbatcher": _run_xbatcher,
    "zarr": _run_zarr,
    "insitu": _run_insitu,
    "insitu_warm": _run_insitu_warm,
    "insitu_persist": _run_insitu_persist,
    "insitu_steady": _run_insitu_steady,
    "decode_ceiling": _run_decode_ceiling,
    "get_ceiling": _run_get_ceiling,
}


def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process; returns its result row (RSS included)."""
    runner = _RUNNERS.get(cfg["loader"])
    if runner is None:
        raise ValueError(f"loader={cfg['loader']!r} is not one of {sorted(_RUNNERS)}")
    with PeakRSS(exclude_pids=cfg.get("rss_exclude_pids", ())) as rss:
        result = runner(cfg)
    result.update(peak_rss_mb=rss.peak / MB, base_rss_mb=rss.base / MB)
    return result


def _preload(modules: Iterable[str]) -> None:
    for name in modules:
        __import__(name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    # imports happen before the clock starts, as in a training script
    _preload(cfg.get("preload", ()))
    result = run_config(cfg)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    sys.stdout.flush()
    # a hung fork worker or a wedged store must not keep the child alive
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
