"""The pytest plugin, used as a user's gate uses it: its fixtures, the emulator's latency, the ratio's arithmetic."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.testing.ceiling import raw_get_ceiling
from insitubatch.testing.pytest_plugin import LINK_MARKER

ROOT = Path(__file__).resolve().parents[2]
# Long enough per GET that the replay's time is dominated by it, short enough for a fast test.
LATENCY_S = 0.05
N_TIME = 256


def _dataset(served, **knobs) -> InSituDataset:
    store = served.store()
    geoms = open_geometries(store)  # consolidated metadata: HTTP opens the group without listing
    manifest = split_by_chunk(next(iter(geoms.values())), fractions=(0.8, 0.1, 0.1))
    return InSituDataset(store, manifest, geoms, **knobs)


def test_registered_through_pytest11_and_inert_until_asked(tmp_path: Path) -> None:
    (ep,) = [e for e in entry_points(group="pytest11") if e.value == "insitubatch.testing.pytest_plugin"]
    assert ep.name == "insitubatch"
    (tmp_path / "test_plain.py").write_text(
        "import threading\n"
        "def test_nothing_started():\n"
        "    assert not [t for t in threading.enumerate() if t.name.startswith('emulator')]\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
    proc = subprocess.run([*run, "test_plain.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([*run, "--fixtures"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    for fixture in ("era5_zarr", "zarr_emulator", "loader_benchmark"):
        assert fixture in proc.stdout
    proc = subprocess.run([*run, "--markers"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert f"@pytest.mark.{LINK_MARKER}" in proc.stdout


def test_era5_zarr_is_written_once_per_shape(era5_zarr) -> None:
    first = era5_zarr(N_TIME)
    assert era5_zarr(N_TIME) == first
    assert (first / "zarr.json").read_text().count("consolidated_metadata") == 1
    other = era5_zarr(N_TIME, samples_per_chunk=4)
    assert other != first and other.parent == first.parent


def test_ceiling_and_ratio_arithmetic_against_the_emulated_latency(
    era5_zarr, zarr_emulator, loader_benchmark, benchmark
) -> None:
    """The replay cannot beat the latency it was given; the ratio is cold over ceiling, on the same GETs."""
    served = zarr_emulator(era5_zarr(N_TIME), latency_s=LATENCY_S, jitter_s=0.0)
    budget = 1 << 30  # room for the split: the warm pass is served from the pool

    # no hedging: a duplicate GET of a slow answer (a loaded machine) would make the count one more than the tiles
    knobs = {"batch_size": 32, "block_chunks": 8, "max_inflight": 16, "cache_budget_bytes": budget, "hedge": False}
    result = loader_benchmark(served, lambda: _dataset(served, **knobs))

    cold, ceiling = result.cold, result.ceiling
    with _dataset(served, batch_size=32, block_chunks=8) as ds:
        plan = ds.plan("train")
        distinct = sum(ds.geometries[path].tiles_per_chunk for path, _ in plan.reads)
    # the same GETs: as many as the plan's distinct tiles, the same bytes, at the loader's concurrency
    assert cold.gets == ceiling.gets == distinct
    assert cold.bytes == ceiling.nbytes > 0
    assert ceiling.concurrency == 16
    # every GET waits LATENCY_S before its first byte: waves of `concurrency` GETs cannot take less
    floor = math.ceil(ceiling.gets / ceiling.concurrency) * LATENCY_S
    assert floor <= ceiling.seconds < 3 * floor + 1.0
    assert cold.seconds >= floor
    # the ratio is cold samples/s over the samples/s of the same samples' raw GETs
    assert cold.samples == plan.n_samples and cold.batches == plan.n_batches
    assert result.ceiling_samples_per_s == pytest.approx(cold.samples / ceiling.seconds)
    assert result.ratio == pytest.approx((cold.samples / cold.seconds) / (cold.samples / ceiling.seconds))
    assert result.ratio == pytest.approx(ceiling.seconds / cold.seconds)
    assert 0.3 < result.ratio < 1.5, result.summary()
    # the warm pass reads the pool; the peak is the split, not more than the budget
    assert result.warm is not None and result.warm.gets == 0 and result.warm.samples == cold.samples
    assert 0 < cold.peak_resident_bytes <= budget
    assert benchmark.extra_info["ratio"] == result.ratio
    assert benchmark.extra_info["cold_gets"] == cold.gets and "warm_samples_per_s" in benchmark.extra_info


def test_the_ceiling_follows_the_link_it_is_given(era5_zarr, zarr_emulator) -> None:
    """Eight waves of two GETs: no latency is fast, 50 ms per GET cannot take under 8 x 50 ms."""
    served = zarr_emulator(era5_zarr(N_TIME), latency_s=0.0, jitter_s=0.0)
    store = served.store()
    keys = [f"2m_temperature/c.{i}.0.0" for i in range(16)]
    raw_get_ceiling(store, keys, concurrency=2)  # connections opened: the replays below time GETs only
    fast = raw_get_ceiling(store, keys, concurrency=2)
    served.configure(latency_s=0.05)
    slow = raw_get_ceiling(store, keys, concurrency=2)
    assert fast.gets == slow.gets == 16 and fast.nbytes == slow.nbytes
    floor = 8 * 0.05
    assert slow.seconds >= floor > fast.seconds, (fast, slow)


@pytest.mark.insitubatch_link(latency_s=0.2, jitter_s=0.0)
def test_the_marker_sets_the_link_and_a_call_overrides_it(era5_zarr, zarr_emulator) -> None:
    slow = zarr_emulator(era5_zarr(N_TIME), process=False)
    fast = zarr_emulator(era5_zarr(N_TIME), process=False, latency_s=0.0)
    for served, at_least, at_most in ((slow, 0.2, None), (fast, 0.0, 0.15)):
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{served.url}/zarr.json", timeout=10) as resp:
            resp.read()
        took = time.perf_counter() - t0
        assert took >= at_least and (at_most is None or took < at_most)
    assert slow.stats().gets == 1


def test_unknown_link_settings_are_passed_through_and_refused_by_name(era5_zarr, zarr_emulator) -> None:
    with pytest.raises(TypeError, match="no_such_setting"):
        zarr_emulator(era5_zarr(N_TIME), process=False, no_such_setting=1)
    assert not [t for t in threading.enumerate() if t.name == "emulator"]  # nothing left serving


def test_under_auto_the_ceiling_replays_at_the_pass_peak_of_gets_in_flight(
    era5_zarr, zarr_emulator, loader_benchmark
) -> None:
    """The controller may have allowed 128 reads; the pass used fewer: the ceiling gets what the pass had."""
    served = zarr_emulator(era5_zarr(N_TIME), latency_s=0.01, jitter_s=0.0)
    result = loader_benchmark(served, lambda: _dataset(served, batch_size=32, block_chunks=2, hedge=False))
    cold = result.cold
    assert cold.inflight_auto and 0 < cold.inflight_peak <= cold.max_inflight
    assert result.ceiling.concurrency == cold.inflight_peak
    assert "peak of GETs in flight under max_inflight='auto'" in result.summary()


def test_replay_concurrency_is_the_pinned_limit_or_the_auto_peak() -> None:
    from insitubatch.testing.loader_bench import PassReport, replay_concurrency

    base = {"samples": 1, "batches": 1, "seconds": 1.0, "gets": 1, "bytes": 1, "peak_resident_bytes": 1}
    report = {**base, "limiting_stage": "store", "advice": ""}
    assert replay_concurrency(PassReport(**report, max_inflight=16, inflight_peak=5)) == 16
    assert replay_concurrency(PassReport(**report, max_inflight=128, inflight_auto=True, inflight_peak=31)) == 31
    assert replay_concurrency(PassReport(**report, max_inflight=64, inflight_auto=True, inflight_peak=0)) == 64


@pytest.mark.parametrize("installed", [True, False])
def test_loader_benchmark_without_pytest_benchmark_says_what_it_needs(tmp_path: Path, installed: bool) -> None:
    """A user's own test file, run with pytest-benchmark inactive (or absent): one clear line, not pytest's bare
    "fixture 'benchmark' not found"."""
    (tmp_path / "test_gate.py").write_text(
        "def test_gate(zarr_emulator, loader_benchmark):\n    loader_benchmark(None, lambda: None)\n"
    )
    # absent: a stand-in module shadows pytest_benchmark's spec lookup; inactive: the plugin is turned off
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"if not {installed}:\n"
        "    real = importlib.util.find_spec\n"
        "    importlib.util.find_spec = lambda name, *a: None if name == 'pytest_benchmark' else real(name, *a)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", "test_gate.py"]
    proc = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "loader_benchmark fixture times passes with pytest-benchmark" in proc.stdout
    assert ("drop '-p no:benchmark'" in proc.stdout) == installed
    assert ("pip install pytest-benchmark" in proc.stdout) == (not installed)
    assert "fixture 'benchmark' not found" not in proc.stdout
