"""The arena (``python -m bench.arena``): its timing window, its ratios and bars, a missing peer, and a smoke run.

The smoke run measures our loader alone (``--quick --loaders ours --only
local http0``) in child processes against a loopback emulator and checks
the fields of ``arena.json``: it needs neither the reference's venv nor
TensorStore.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.arena.harness import steady
from bench.arena.peers import reference_python
from bench.arena.report import BARS, bars, ratios

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
    report = (out / "arena.md").read_text()
    assert "## Bars" in report and "| http0 | ours |" in report
