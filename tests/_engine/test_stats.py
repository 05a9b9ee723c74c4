"""Per-pass stats: counts match the counters, and ``limiting_stage`` names constructed bottlenecks.

Each bottleneck is made ~10x dominant so the answer holds on a loaded 2-core
machine: a store that sleeps per GET, a chunk transform that sleeps, an
explicit budget that forces every chunk of the second epoch to be re-read
from a slow store, a consumer that sleeps per batch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import get_args

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, smooth_field, write_array

from insitubatch import InSituDataset, PassStats, open_geometries, split_by_chunk
from insitubatch._engine.stats import (
    CONSUMER_WAIT_SHARE,
    FULL_CONCURRENCY_SHARE,
    MIN_PRESSURE,
    READ_AHEAD_SHARE,
    Stage,
)

STAGES = get_args(Stage)  # the stages a pass may name as limiting

# A GET (or a transform, or a step) this slow dwarfs the rest of a pass over a few hundred KB.
SLOW_S = 0.03


@pytest.fixture
def zarr_path(tmp_path):
    root = zarr.open_group(tmp_path / "s.zarr", mode="w")
    write_array(root, "t2m", smooth_field(np.random.default_rng(0), (128, 16, 16)), (4, 16, 8))
    return tmp_path / "s.zarr"


def _dataset(store, **kw) -> InSituDataset:
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(1.0,))
    kw.setdefault("max_inflight", 8)
    kw.setdefault("decode_threads", 2)
    kw.setdefault("block_chunks", 4)
    return InSituDataset(store, manifest, geoms, batch_size=8, **kw)


def _drain(view, step_s: float = 0.0) -> PassStats:
    it = iter(view)
    for _ in it:
        if step_s:
            time.sleep(step_s)
    stats = view.last_pass
    assert stats is not None and stats.finished
    assert stats == it.stats
    return stats


def test_stats_agree_with_the_counters_and_the_plan(zarr_path) -> None:
    store = CountingStore(local_store(zarr_path))
    with _dataset(store) as ds:
        assert ds.train.last_pass is None
        it = iter(ds.train)
        live = it.stats
        assert not live.finished and ds.train.last_pass is not None
        for _ in it:
            pass
        s = ds.train.last_pass
        c = it.counters
        plan = ds.train.plan()
    assert (s.samples, s.batches) == (plan.n_samples, plan.n_batches)
    assert (s.gets, s.get_bytes, s.hits, s.misses) == (c.gets, c.get_bytes, c.hits, c.misses)
    assert s.gets == sum(store.chunk_gets().values())
    assert s.re_reads == 0 and s.bad_tiles == 0
    assert s.wall_s > 0 and s.samples_per_s == pytest.approx(s.samples / s.wall_s)
    for name in ("fetch_s", "decode_s", "gather_s", "consumer_wait_s"):
        assert getattr(s, name) > 0, name
    assert s.transform_s == 0
    assert 0 <= s.queue_depth_mean <= s.queue_depth_max <= ds.prefetch_depth
    assert 0 <= s.inflight_depth_mean <= s.inflight_depth_max <= ds.max_inflight
    d = s.to_dict()
    assert d["limiting_stage"] in STAGES and d["samples"] == s.samples


def test_slow_store_is_named(zarr_path) -> None:
    with _dataset(CountingStore(local_store(zarr_path), latency_s=SLOW_S)) as ds:
        s = _drain(ds.train)
    assert s.limiting_stage == "store", s.summary()
    assert s.fetch_s > 5 * (s.decode_s + s.transform_s)


def test_a_store_limited_pass_capped_by_its_read_ahead_is_told_to_raise_block_chunks(zarr_path) -> None:
    """One chunk per shuffle block: a window of a few GETs, whatever max_inflight allows."""
    store = CountingStore(local_store(zarr_path), latency_s=SLOW_S)
    with _dataset(store, block_chunks=1, max_inflight=64) as ds:
        store.reset()  # opening gathers metadata GETs concurrently; count the pass's only
        s = _drain(ds.train)
        window = ds.train.plan().read_ahead_bound * 2  # two tiles per chunk read
    assert s.limiting_stage == "store", s.summary()
    assert s.read_window == window < READ_AHEAD_SHARE * s.max_inflight
    assert store.peak_inflight <= window < 64  # the permits were never all in use
    assert s.store_bound == "read-ahead"
    assert "raise block_chunks" in s.advice and "changes nothing" in s.advice
    assert s.to_dict()["store_bound"] == "read-ahead" and s.to_dict()["advice"] == s.advice


def test_a_store_limited_pass_at_full_concurrency_is_told_to_raise_max_inflight(zarr_path) -> None:
    """Two permits under a window of dozens of GETs: every permit busy all pass."""
    store = CountingStore(local_store(zarr_path), latency_s=SLOW_S)
    with _dataset(store, block_chunks=16, max_inflight=2) as ds:
        store.reset()  # opening gathers metadata GETs concurrently; count the pass's only
        s = _drain(ds.train)
    assert s.limiting_stage == "store", s.summary()
    assert s.read_window >= READ_AHEAD_SHARE * s.max_inflight
    assert store.peak_inflight == 2
    assert s.store_bound == "concurrency"
    assert "raise max_inflight" in s.advice and "block_chunks" not in s.advice


@pytest.mark.slow
def test_the_advised_knob_is_the_one_that_helps(zarr_path) -> None:
    """On the read-ahead-capped pass, 4x max_inflight changes little and 8x block_chunks a lot; and the reverse."""

    def rate(**kw) -> float:
        with _dataset(CountingStore(local_store(zarr_path), latency_s=SLOW_S), **kw) as ds:
            return _drain(ds.train).samples_per_s

    capped = rate(block_chunks=1, max_inflight=16)
    assert rate(block_chunks=1, max_inflight=64) < 1.3 * capped
    assert rate(block_chunks=8, max_inflight=16) > 1.5 * capped
    saturated = rate(block_chunks=16, max_inflight=2)
    assert rate(block_chunks=16, max_inflight=8) > 2 * saturated


def test_slow_transform_is_named_decode(zarr_path) -> None:
    def slow(chunk):
        time.sleep(SLOW_S)  # stands for a costly regrid; sleeping releases the GIL like numpy would
        return chunk

    with _dataset(local_store(zarr_path), chunk_transforms=[slow]) as ds:
        s = _drain(ds.train)
    assert s.limiting_stage == "decode", s.summary()
    assert s.transform_s > 5 * s.decode_s


def test_tiny_budget_is_named(zarr_path) -> None:
    store = CountingStore(local_store(zarr_path), latency_s=SLOW_S / 3)
    geoms = open_geometries(store)
    probe = _dataset(store)
    working = probe.train.plan().working_set_bytes
    probe.close()
    # the budget holds one pass's working set, never the epoch: the second epoch re-reads every chunk
    with _dataset(store, cache_budget_bytes=working) as ds:
        _drain(ds.train)
        ds.set_epoch(1)
        s = _drain(ds.train)
    assert geoms and s.re_reads == s.misses > 0
    assert s.evictions > 0
    assert s.limiting_stage == "budget", s.summary()


def test_roomy_budget_second_epoch_hits_and_is_not_budget(zarr_path) -> None:
    with _dataset(CountingStore(local_store(zarr_path), latency_s=SLOW_S), cache_budget_bytes=1 << 30) as ds:
        first = _drain(ds.train)
        ds.set_epoch(1)
        second = _drain(ds.train)
    assert first.limiting_stage == "store"
    assert second.gets == 0 and second.re_reads == 0 and second.hits == len(ds.train.plan().reads)
    assert second.limiting_stage != "budget"


def test_slow_consumer_is_named(zarr_path) -> None:
    with _dataset(local_store(zarr_path)) as ds:
        s = _drain(ds.train, step_s=SLOW_S)
    assert s.limiting_stage == "consumer", s.summary()
    assert s.producer_wait_s > s.consumer_wait_s


def _stats(**kw) -> PassStats:
    base = dict(
        split="train",
        epoch=0,
        samples=800,
        batches=100,
        wall_s=10.0,
        gets=100,
        get_bytes=10**6,
        hits=0,
        misses=50,
        revived=0,
        evictions=0,
        re_reads=0,
        bad_tiles=0,
        fetch_s=0.0,
        decode_s=0.0,
        transform_s=0.0,
        gather_s=0.1,
        consumer_wait_s=9.0,
        producer_wait_s=0.0,
        data_wait_s=9.0,
        budget_wait_s=0.0,
        inflight_depth_mean=0.0,
        inflight_depth_max=0,
        queue_depth_mean=0.0,
        queue_depth_max=0,
        max_inflight=32,
        decode_threads=2,
        cache_budget_bytes=None,
        finished=True,
    )
    return PassStats(**{**base, **kw})


def test_the_rule_on_constructed_numbers() -> None:
    assert _stats(batches=1, fetch_s=100.0).limiting_stage == "unknown"
    assert _stats(wall_s=0.0).limiting_stage == "unknown"
    assert _stats(consumer_wait_s=CONSUMER_WAIT_SHARE * 10.0, fetch_s=100.0).limiting_stage == "consumer"
    assert _stats(fetch_s=80.0, decode_s=5.0).limiting_stage == "store"
    assert _stats(fetch_s=2.0, decode_s=9.0, transform_s=9.0).limiting_stage == "decode"
    assert _stats(fetch_s=0.5, decode_s=0.5, budget_wait_s=8.0).limiting_stage == "budget"
    # a window full of ready chunks the producer is still gathering is no budget stall
    assert _stats(fetch_s=0.5, decode_s=0.5, budget_wait_s=8.0, data_wait_s=0.1).limiting_stage == "unknown"
    low = MIN_PRESSURE * 10.0 * 0.9
    assert _stats(fetch_s=low, decode_s=low, budget_wait_s=low).limiting_stage == "unknown"
    # re-reads under an explicit budget outrank the stage they keep busy; under the automatic one they do not
    assert _stats(fetch_s=80.0, re_reads=50, cache_budget_bytes=10**6).limiting_stage == "budget"
    assert _stats(fetch_s=80.0, re_reads=50).limiting_stage == "store"
    s = _stats(fetch_s=80.0)
    assert s.summary().endswith(f"limited by: store — {s.advice}")
    # the store verdict: a known window under READ_AHEAD_SHARE x max_inflight is the read-ahead's doing
    assert _stats(fetch_s=80.0, read_window=READ_AHEAD_SHARE * 32 - 1).store_bound == "read-ahead"
    assert _stats(fetch_s=80.0, read_window=READ_AHEAD_SHARE * 32).store_bound == "concurrency"
    # without a window, the mean GETs outstanding (fetch_s / wall_s) against max_inflight decides
    assert _stats(fetch_s=FULL_CONCURRENCY_SHARE * 32 * 10.0 * 0.9).store_bound == "read-ahead"
    assert _stats(fetch_s=FULL_CONCURRENCY_SHARE * 32 * 10.0 * 1.1).store_bound == "concurrency"
    assert _stats(fetch_s=2.0, decode_s=9.0).store_bound is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.samples = 1  # type: ignore[misc]


def test_one_info_line_per_pass_and_no_handler(zarr_path, caplog) -> None:
    logger = logging.getLogger("insitubatch")
    assert logger.handlers == []
    with caplog.at_level(logging.INFO, logger="insitubatch"), _dataset(local_store(zarr_path)) as ds:
        _drain(ds.train)
        it = iter(ds.train)
        next(it)
        it.close()
    lines = [r for r in caplog.records if r.name == "insitubatch" and r.levelno == logging.INFO]
    assert len(lines) == 2
    assert all(" — " in r.getMessage() and "limited by: " in r.getMessage() for r in lines)
    assert lines[0].getMessage().split("limited by: ")[1].split(" — ")[0] in STAGES
