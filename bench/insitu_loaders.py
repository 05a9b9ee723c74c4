"""insitubatch as the report measures it: cold, warm from its pool, warm from its persisted cache, steady passes.

Each ``run_*`` takes a measurement's JSON config (``bench.child``) and
returns its row, with the engine's own counters (GETs, hits, hedged
duplicates, the reads-in-flight limit it ran at) and the memory it may hold
by design (the RSS bar's terms).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .measure import cpu_s, measure, result_row
from .rows import MB
from .split_tiles import geometries, open_store, sample_nbytes, train_indices

__all__ = [
    "run_insitu",
    "run_insitu_persist",
    "run_insitu_steady",
    "run_insitu_warm",
    "supports_persist",
]


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


def run_insitu(cfg: dict[str, Any]) -> dict[str, Any]:
    holder: dict[str, Any] = {}

    def start() -> Iterator[Any]:
        store = open_store(cfg["url"])
        geoms = geometries(store, cfg["variables"])
        ds = _insitu_dataset(cfg, store, geoms)
        holder.update(ds=ds, geoms=geoms)
        it = iter(ds.train)
        holder["it"] = it
        return it

    m = measure(start, lambda b: b.sample_indices, window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    ds, it = holder["ds"], holder["it"]
    out = result_row(cfg, m, holder["geoms"])
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


def run_insitu_warm(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fill a pool that holds the split with one epoch (not timed), then time the next one."""
    store = open_store(cfg["url"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
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

    m = measure(start, lambda b: b.sample_indices, window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    out = result_row(cfg, m, geoms)
    out.update(_insitu_counters(holder["it"]), cache_budget_mb=budget / MB)
    ds.close()
    return out


def run_insitu_steady(cfg: dict[str, Any]) -> dict[str, Any]:
    """Passes of one dataset back to back; the rate and CPU per sample of a window after a warm-up."""
    from insitubatch.stores.obstore_stores import obstore_store

    store = obstore_store(cfg["url"], read_only=True, **cfg.get("store_options", {}))
    geoms = geometries(store, cfg["variables"])
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
                t0, cpu0 = now, cpu_s()
            elif t0 is not None:
                samples += len(batch.sample_indices)
                if now - t0 >= window:
                    break
        stats = it.stats
        it.close()
        passes += 1
    assert stats is not None and t0 is not None and cpu0 is not None  # at least one batch came after the warm-up
    cpu = cpu_s() - cpu0
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
        "mb_per_s": samples * sample_nbytes(geoms) / elapsed / MB,
        "last_pass": stats.to_dict(),
    }


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


def run_insitu_persist(cfg: dict[str, Any]) -> dict[str, Any]:
    """``phase="fill"``: one epoch into a persisted cache; ``"warm"``: a new process reads it back."""
    holder: dict[str, Any] = {}

    def start() -> Iterator[Any]:
        store = open_store(cfg["url"])
        geoms = geometries(store, cfg["variables"])
        ds = _insitu_dataset(cfg, store, geoms, cache_dir=cfg["cache_dir"], persist=True)
        holder.update(ds=ds, geoms=geoms)
        holder["it"] = it = iter(ds.train)
        return it

    m = measure(start, lambda b: b.sample_indices, window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    out = result_row(cfg, m, holder["geoms"])
    out.update(_insitu_counters(holder["it"]), phase=cfg["phase"])
    holder["ds"].close()
    return out
