"""Our loader in the arena: ``InSituDataset(store, manifest, variables, batch_size=32)``, nothing else set.

Run in a child process of our virtual environment (:mod:`bench.child`).
Besides the steady window or the cold pass (:func:`bench.arena.harness.time_passes`;
in a cold pass, the reads-in-flight limit and peak at each tenth) its row has
what ``describe()`` promises about memory (``total_bytes``, the bound on
what the loader holds) next to what the process held: its RSS before the
dataset was built (the interpreter, the imports, the opened store) and its
peak, and whether the peak stayed within the bound plus that baseline. The
most reads in flight any pass reached (``inflight_peak``, the cold pass
included) is what the raw-GET ceiling replays at.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..measure import rss_bytes
from ..rows import MB
from ..split_tiles import open_location
from .harness import start, time_passes, train_digest

__all__ = ["run_ours"]


def run_ours(cfg: dict[str, Any]) -> dict[str, Any]:
    """Time our loader at its default knobs over ``cfg['location']``; the row with the memory bound."""
    from insitubatch.dataset import InSituDataset
    from insitubatch.io.group import open_geometries
    from insitubatch.plan.splits import split_by_chunk
    from insitubatch.stores.owned import close_store

    variables = list(cfg["variables"])
    started = start()  # a cold pass counts from here: the store's open, the split, the dataset's build
    store = open_location(cfg["location"])
    geoms = open_geometries(store, variables=variables)
    manifest = split_by_chunk(next(iter(geoms.values())), fractions=tuple(cfg["fractions"]))
    train = manifest.sample_indices("train")
    base_rss = rss_bytes()  # before the dataset exists: the interpreter, imports and the open store
    ds = InSituDataset(store, manifest, variables, batch_size=int(cfg["batch_size"]))

    def open_pass(epoch: int) -> Any:
        ds.set_epoch(epoch)
        return iter(ds.train)

    def close_pass(it: Any) -> dict[str, Any]:
        it.close()
        s = it.stats
        return {
            "inflight_peak": s.inflight_peak,
            "inflight_median": s.inflight_median,
            "limiting_stage": s.limiting_stage,
            "gets": s.gets,
        }

    def probe(it: Any) -> dict[str, Any]:  # the pass so far: the reads-in-flight limit now and the most reached
        s = it.stats
        return {"max_inflight": s.max_inflight, "inflight_peak": s.inflight_peak, "gets": s.gets}

    window = time_passes(cfg, started, open_pass, len, samples=len(train), close_pass=close_pass, probe=probe)
    info = ds.describe()  # after the timing: not a step of a training script's cold start
    memory = info["memory"]
    ds.close()
    close_store(store)
    peak = rss_bytes("VmHWM")
    bound = int(memory["total_bytes"])
    passes = window.pass_stats
    timed = [p for p in passes if p["timed"]]
    return {
        **window.row(),
        "train_samples": len(train),
        "train_digest": train_digest(train),
        "base_rss_mb": base_rss / MB,
        "bound_mb": bound / MB,
        "budget_mb": int(memory["budget_bytes"]) / MB,
        "within_bound": peak <= bound + base_rss,
        "decode_threads": int(info["resolved"]["decode_threads"]),
        # the most GETs in flight any pass reached (the cold one included): what the raw-GET ceiling replays at
        "inflight_peak": max((p["inflight_peak"] for p in passes), default=0),
        "inflight_median": int(np.median([p["inflight_median"] for p in timed])) if timed else 0,
        "limiting_stage": timed[-1]["limiting_stage"] if timed else None,
        "window_gets": sum(p["gets"] for p in timed),  # the GETs of the passes the window saw (whole passes)
    }
