"""The arena (``python -m bench.arena``): its timing window and cold pass, TensorStore's cache that holds the split,
its ratios, bars and tables, a missing peer, and a smoke run.

The smoke run measures our loader alone (``--quick --loaders ours --only
local http0``, steady state and one cold pass) in child processes against a
loopback emulator and checks the fields of ``arena.json``: it needs neither
the reference's venv nor TensorStore.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

from bench.arena.harness import COLD_PARTS, ColdPass, Window, cold, start, steady, time_passes
from bench.arena.peers import reference_python
from bench.arena.report import BARS, bars, cold_table, markdown, ratios
from bench.arena.run import SPLIT_CACHE_MARGIN, our_plan
from bench.arena.scenarios import ArenaProfile
from insitubatch.testing.data import era5_181x360, write_era5_like

REPO_ROOT = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT_S = 300


def _passes(
    batches_per_pass: int, batch: int, sleep_s: float, closed: list[int]
) -> tuple[Callable[[int], Iterator[int]], Callable[[Iterator[int]], dict[str, int]]]:
    def open_pass(epoch: int) -> Iterator[int]:
        def gen() -> Iterator[int]:
            for _ in range(batches_per_pass):
                time.sleep(sleep_s)
                yield batch

        return gen()

    def close_pass(it: Iterator[int]) -> dict[str, int]:
        closed.append(1)
        return {"closed": len(closed)}

    return open_pass, close_pass


def test_steady_warms_up_whole_passes_then_times_a_window() -> None:
    closed: list[int] = []
    open_pass, close_pass = _passes(batches_per_pass=5, batch=4, sleep_s=0.01, closed=closed)
    w = steady(
        open_pass,
        lambda b: b,
        warmup_passes=2,
        warmup_s=0.0,
        warmup_max_s=60.0,
        window_s=0.12,
        close_pass=close_pass,
    )
    assert w.warmup_passes == 2 and w.warmup_samples == 2 * 5 * 4  # the window opened at the second pass's end
    assert w.samples % 4 == 0 and w.samples >= 0.12 / 0.01 * 4 * 0.5
    assert w.seconds >= 0.12 and w.passes >= 4  # the window spans passes, each opened and closed
    assert len(closed) == w.passes == len(w.pass_stats)  # every pass closed, its statistics kept
    assert [p["timed"] for p in w.pass_stats][:3] == [False, False, True]
    row = w.row()
    assert row["rate_samples_per_s"] == pytest.approx(w.samples / w.seconds)
    assert row["cpu_s_per_sample"] == pytest.approx(w.cpu_s / w.samples)


def test_steady_caps_the_warm_up_of_a_slow_loader() -> None:
    closed: list[int] = []
    open_pass, close_pass = _passes(batches_per_pass=1000, batch=1, sleep_s=0.01, closed=closed)
    t0 = time.perf_counter()
    w = steady(open_pass, lambda b: b, warmup_passes=1, warmup_s=0.0, warmup_max_s=0.1, window_s=0.1)
    assert w.warmup_passes == 0 and 0.1 <= w.warmup_s < 0.5  # timed from the cap, inside the first pass
    assert w.samples > 0 and time.perf_counter() - t0 < 5


def _row(rate: float, cpu: float, rss: float) -> dict[str, float]:
    return {"rate_samples_per_s": rate, "cpu_s_per_sample": cpu, "peak_rss_mb": rss}


def test_ratios_and_bars_within_one_run() -> None:
    results = {
        "scenarios": {
            "local": {"rows": {"ours": _row(1000, 0.001, 500), "reference": _row(500, 0.002, 400)}},
            "s3": {"rows": {"ours": _row(900, 0.0012, 500), "reference": _row(300, 0.003, 400)}},
            "tail40": {
                "rows": {
                    "ours": _row(600, 0.002, 450),
                    "reference": {"loader": "reference", "skipped": "no Python 3.12"},
                    "tensorstore": _row(200, 0.004, 300),
                    "get_ceiling": _row(800, 0.001, 80),
                }
            },
        },
        "decode_ceiling": {"rate_samples_per_s": 1250.0},
    }
    found = ratios(results)
    assert found["local.ours_over_reference"] == pytest.approx(2.0)
    assert found["local.over_decode_ceiling"] == pytest.approx(0.8)
    assert found["s3.cpu_over_local"] == pytest.approx(1.2)
    assert found["s3.cpu_ours_over_reference"] == pytest.approx(0.4)
    assert found["tail40.ours_over_tensorstore"] == pytest.approx(3.0)
    assert found["tail40.over_get_ceiling"] == pytest.approx(0.75)
    assert found["tail40.ours_over_reference"] is None  # a skipped peer is no number
    verdicts = {b["key"]: b["met"] for b in bars(found)}
    assert len(verdicts) == len(BARS)
    assert verdicts["s3.cpu_ours_over_reference"] is True
    assert verdicts["s3.cpu_over_local"] is True
    assert verdicts["local.over_decode_ceiling"] is False
    assert verdicts["tail40.ours_over_reference"] is None and verdicts["http0.cpu_over_local"] is None


def test_a_reference_that_cannot_be_made_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    python, why = reference_python(
        tmp_path / "venv", REPO_ROOT, base_python=str(tmp_path / "no-such-python"), log=lambda _: None
    )
    assert python is None and why is not None and "no-such-python" in why


@pytest.mark.slow
def test_quick_arena_of_ours_writes_every_field(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bench.arena", "--quick", "--loaders", "ours", "--only", "local", "http0"]
    cmd += ["--out", str(out), "--data", str(tmp_path / "data"), "--reference-venv", str(tmp_path / "never-made")]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "never-made").exists()  # ours alone never makes the reference's venv
    results = json.loads((out / "arena.json").read_text())
    assert list(results["scenarios"]) == ["local", "http0"]
    meta = results["meta"]
    assert meta["profile"] == "quick" and len(meta["loadavg_start"]) == 3 and meta["dataset"]["train_samples"] > 0
    for name in ("local", "http0"):
        rows = results["scenarios"][name]["rows"]
        assert "reference" not in rows and "tensorstore" not in rows
        ours = rows["ours"]
        assert not ours.get("error"), ours
        assert ours["rate_samples_per_s"] > 0 and ours["cpu_s_per_sample"] > 0 and ours["samples"] > 0
        assert ours["peak_rss_mb"] >= ours["base_rss_mb"] > 0 and ours["bound_mb"] > 0
        assert isinstance(ours["within_bound"], bool) and ours["decode_threads"] >= 1
        assert ours["train_samples"] == meta["dataset"]["train_samples"] and len(ours["train_digest"]) == 12
    http_rows = results["scenarios"]["http0"]["rows"]
    assert http_rows["ours"]["gets"] > 0 and http_rows["ours"]["inflight_peak"] >= 1
    ceiling = http_rows["get_ceiling"]
    assert not ceiling.get("error") and ceiling["concurrency"] == http_rows["ours"]["inflight_peak"]
    assert ceiling["rate_samples_per_s"] > 0
    assert "get_ceiling" not in results["scenarios"]["local"]["rows"]  # no link to replay on local files
    decode = results["decode_ceiling"]
    assert not decode.get("error") and decode["rate_samples_per_s"] > 0
    assert decode["threads"] == results["scenarios"]["local"]["rows"]["ours"]["decode_threads"]
    assert results["ratios"]["local.over_decode_ceiling"] > 0 and results["ratios"]["http0.cpu_over_local"] > 0
    assert results["ratios"]["http0.ours_over_reference"] is None
    verdicts = {b["key"]: b for b in results["bars"]}
    assert isinstance(verdicts["http0.cpu_over_local"]["met"], bool)
    assert verdicts["tail40.ours_over_reference"]["met"] is None
    for name in ("local", "http0"):  # and one cold pass each, the open included
        one = results["scenarios"][name]["cold_rows"]["ours"]
        assert not one.get("error"), one
        assert one["samples"] == one["train_samples"] == meta["dataset"]["train_samples"]
        assert 0 < one["open_s"] < one["first_batch_s"] <= one["seconds"] and one["cpu_s_per_sample"] > 0
        assert len(one["parts"]) == COLD_PARTS and one["pass_stats"][0]["timed"] is True
    http_cold = results["scenarios"]["http0"]["cold_rows"]["ours"]
    assert http_cold["first_probe"]["max_inflight"] >= 1 and http_cold["parts"][-1]["max_inflight"] >= 1
    assert results["ratios"]["http0.cold_ours_over_tensorstore"] is None  # TensorStore was not asked for
    report = (out / "arena.md").read_text()
    assert "## Bars" in report and "| http0 | ours |" in report and "## One cold pass" in report


def test_cold_times_one_pass_from_before_the_open() -> None:
    closed: list[int] = []
    open_pass, close_pass = _passes(batches_per_pass=20, batch=4, sleep_s=0.01, closed=closed)
    started = start()
    time.sleep(0.05)  # the loader's open
    p = cold(started, open_pass, lambda b: b, samples=80, close_pass=close_pass, probe=lambda it: {"probed": 1})
    assert p.samples == 80 and closed == [1] and p.pass_stats == [{"closed": 1, "timed": True}]
    assert 0.05 <= p.open_s < p.first_batch_s < p.half_s < p.seconds  # the open counts, then the pass
    assert p.seconds >= 0.05 + 20 * 0.01 and p.half_samples == 40 and p.cpu_s >= 0
    assert len(p.parts) == COLD_PARTS and all(part["probed"] == 1 for part in p.parts) and p.first_probe["probed"]
    assert [part["end_s"] for part in p.parts] == sorted(part["end_s"] for part in p.parts)
    assert p.parts[-1]["end_s"] <= p.seconds
    row = p.row()
    assert row["rate_samples_per_s"] == pytest.approx(80 / p.seconds)
    assert row["first_half_samples_per_s"] == pytest.approx(40 / (p.half_s - p.open_s))
    assert row["second_half_samples_per_s"] == pytest.approx(40 / (p.seconds - p.half_s))


def test_cold_closes_a_pass_that_fails() -> None:
    closed: list[int] = []

    def open_pass(epoch: int) -> Iterator[int]:
        yield 4
        raise OSError("the store went away")

    with pytest.raises(OSError, match="went away"):
        cold(start(), open_pass, lambda b: b, samples=8, close_pass=lambda it: closed.append(1) or {})
    assert closed == [1]


def test_time_passes_follows_the_configs_mode() -> None:
    timing_cfg = {"warmup_passes": 0, "warmup_s": 0.0, "warmup_max_s": 1.0, "window_s": 0.02}
    open_pass, _ = _passes(batches_per_pass=3, batch=2, sleep_s=0.005, closed=[])
    one = time_passes({"mode": "cold"}, start(), open_pass, lambda b: b, samples=6)
    assert isinstance(one, ColdPass) and one.samples == 6
    assert isinstance(time_passes(timing_cfg, start(), open_pass, lambda b: b, samples=6), Window)
    with pytest.raises(ValueError, match="mode='warm'"):
        time_passes({"mode": "warm"}, start(), open_pass, lambda b: b, samples=6)


def test_tensorstores_cold_cache_holds_the_splits_decoded_tiles(tmp_path: Path) -> None:
    # 13 x 20 in 2 x 2 tiles of 7 x 10: the edge tiles are padded to 7 rows, as a chunk cache holds them
    spec = era5_181x360(64, (13, 20))
    write_era5_like(tmp_path / spec.name, spec)
    profile = ArenaProfile("tiny", spec, 8, 0, 0.0, 1.0, 1.0, 60.0, orders_epochs=2)
    plan = our_plan(tmp_path / spec.name, profile, tmp_path)
    train = np.unique(np.load(plan["orders_path"])[0])
    assert len(train) == plan["train_samples"] > 0
    expected = 0
    for name in spec.variables:  # zarr's own chunk grid as the oracle
        arr = zarr.open_array(tmp_path / spec.name / name, mode="r")
        tiles = int(np.prod([-(-n // c) for n, c in zip(arr.shape[1:], arr.chunks[1:])]))
        expected += len(np.unique(train // arr.chunks[0])) * tiles * int(np.prod(arr.chunks)) * arr.dtype.itemsize
    assert plan["split_bytes"] == expected
    assert plan["split_cache_bytes"] == int(expected * SPLIT_CACHE_MARGIN) > expected


def _cold(rate: float, cpu: float, **extra: object) -> dict[str, object]:
    parts = [{"end_s": 1.0, "samples_per_s": rate / 2, "max_inflight": 64, "inflight_peak": 40}]
    parts.append({"end_s": 2.0, "samples_per_s": rate * 2, "max_inflight": 128, "inflight_peak": 120})
    row: dict[str, object] = {**_row(rate, cpu, 300), "open_s": 0.1, "first_batch_s": 0.3, "parts": parts}
    row["first_probe"] = {"max_inflight": 32, "inflight_peak": 20}
    return {**row, "first_half_samples_per_s": rate / 2, "second_half_samples_per_s": rate * 2, **extra}


def test_the_cold_table_ratios_and_bars() -> None:
    results = {
        "scenarios": {
            "http0": {
                "rows": {},
                "cold_rows": {
                    "ours": _cold(900.0, 0.0012),
                    "reference": {"loader": "reference", "skipped": "no Python 3.12"},
                    "tensorstore": _cold(500.0, 0.001, cache_mb=3400.0, cache_is="the split"),
                },
            },
            "http30": {"rows": {}, "cold_rows": {"ours": _cold(600.0, 0.0015), "tensorstore": {"error": "boom"}}},
        },
        "meta": {"cold": "one pass in a fresh child"},
    }
    found = ratios(results)
    assert found["http0.cold_ours_over_tensorstore"] == pytest.approx(1.8)
    assert found["http0.cold_cpu_ours_over_tensorstore"] == pytest.approx(1.2)
    assert found["http0.cold_ours_over_reference"] is None and found["http30.cold_ours_over_tensorstore"] is None
    assert "http0.ours_over_tensorstore" not in found  # no steady rows in a --cold-only run: no steady ratios
    verdicts = {b["key"]: b["met"] for b in bars(found)}
    assert verdicts["http0.cold_ours_over_tensorstore"] is True
    assert verdicts["http30.cold_ours_over_tensorstore"] is None  # a failed side is "not measured"
    found["http0.cold_ours_over_tensorstore"] = 1.4
    assert {b["key"]: b["met"] for b in bars(found)}["http0.cold_ours_over_tensorstore"] is False
    table = cold_table(results)
    assert "| http0 | ours | 900.0 | 0.10 | 0.30 | 450.0 | 1,800.0 | 450.0 | 1,800.0 | 1.20 | 300 | – |" in table
    assert "| 3,400 (the split) |" in table and "| http0 | reference | skipped: no Python 3.12 |" in table
    assert "| http30 | tensorstore | error: boom |" in table
    results.update(ratios=found, bars=bars(found))
    report = markdown(results)
    assert "## One cold pass" in report and "one pass in a fresh child" in report
    assert "- http0: first batch 32/20; tenths 64/40, 128/120" in report  # our reads in flight as the pass went
    assert "| scenario | loader | samples/s | CPU ms/sample" not in report  # no steady table without steady rows
    assert cold_table({"scenarios": {"local": {"rows": {"ours": _row(1, 1, 1)}}}}) == ""
