"""The GIL probe measured directly: parallelism, chunk resizing, the wall-clock fallback, thread errors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from insitubatch.tools.gil_probe import PROBE_MAX_CALL_S, SCHEDSTAT_PATH, _usable_cpus, flag_threshold, gil_probe
from insitubatch.transforms import ChunkRead, DecodedChunk, kelvin_to_celsius


def test_gil_probe_measures_parallelism_directly() -> None:
    data = np.full((4, 64, 64), 300.0, dtype="f4")
    data.flags.writeable = False
    chunk = DecodedChunk(ChunkRead("t", 0), data, 0)

    def per_element(c: DecodedChunk) -> DecodedChunk:
        out = [float(v) - 273.15 for v in c.data.reshape(-1)[:20_000]]
        return DecodedChunk(c.read, np.asarray(out, dtype="f4"), c.sample_offset)

    held = gil_probe(per_element, chunk, threads=4)
    free = gil_probe(kelvin_to_celsius, chunk, threads=4)
    if held is None or free is None:  # no verdict is only allowed where nothing can measure
        assert not (Path(SCHEDSTAT_PATH).exists() or _usable_cpus() > 1), (held, free)
        return
    assert held.holds_gil and held.parallelism < flag_threshold(4), held
    assert not free.holds_gil and free.parallelism >= flag_threshold(4), free
    assert flag_threshold(2) == pytest.approx(1.3)


def test_gil_probe_cuts_a_slow_chunk_along_the_sample_axis() -> None:
    seen: list[int] = []

    def sort_rows(c: DecodedChunk) -> DecodedChunk:  # ~20 ms of GIL-free numpy per sample
        seen.append(c.data.shape[0])
        return DecodedChunk(c.read, np.sort(c.data, axis=1, kind="stable"), c.sample_offset)

    data = np.random.default_rng(0).standard_normal((16, 200_000)).astype("f4")
    probe = gil_probe(sort_rows, DecodedChunk(ChunkRead("t", 0), data, 0), threads=2)
    assert seen[0] == 16 and min(seen) < 16  # one call was too long for the window: fewer samples
    if probe is not None:
        assert probe.samples < 16 and probe.call_s < 16 * PROBE_MAX_CALL_S and not probe.holds_gil, probe


def test_gil_probe_falls_back_to_wall_clock_without_scheduler_accounting(monkeypatch) -> None:
    import insitubatch.tools.gil_probe as probe_mod

    monkeypatch.setattr(probe_mod, "_schedstat_live", lambda: False)
    monkeypatch.setattr(probe_mod, "_usable_cpus", lambda: 1)
    chunk = DecodedChunk(ChunkRead("t", 0), np.full((4, 64, 64), 300.0, "f4"), 0)
    assert gil_probe(kelvin_to_celsius, chunk) is None  # one core, no accounting: nothing to conclude
    monkeypatch.setattr(probe_mod, "_usable_cpus", lambda: 2)
    probe = gil_probe(kelvin_to_celsius, chunk, trials=1)
    assert probe is not None and probe.method == "wall-clock" and probe.threads == 2
    assert probe.threshold == pytest.approx(1.3) and probe.parallelism > 0


def test_gil_probe_measures_throughput_where_the_accounting_contradicts_the_clocks(monkeypatch) -> None:
    """Accounting that shows a thread waiting longer than the wall clock ran cannot give a verdict."""
    import time

    import insitubatch.tools.gil_probe as probe_mod

    trials: list[str] = []
    real_run_together = probe_mod._run_together

    def counted(call, threads, window_s):  # type: ignore[no-untyped-def]
        trials.append(f"{threads} threads")
        return real_run_together(call, threads, window_s)

    monkeypatch.setattr(probe_mod, "_schedstat_live", lambda: True)
    monkeypatch.setattr(probe_mod, "_schedstat", lambda: (0.0, 2 * time.perf_counter()))  # waits run at 2x wall
    monkeypatch.setattr(probe_mod, "_run_together", counted)
    chunk = DecodedChunk(ChunkRead("t", 0), np.full((4, 64, 64), 300.0, "f4"), 0)
    probe = gil_probe(kelvin_to_celsius, chunk, threads=4, trials=2)
    if _usable_cpus() < 2:
        assert probe is None
        return
    assert probe is not None and probe.method == "wall-clock", probe
    assert probe.threads == min(4, _usable_cpus()) and probe.threshold == flag_threshold(probe.threads)
    assert trials[0] == "4 threads" and trials[1] == "1 threads"  # one accounting trial, then throughput only


def test_gil_probe_reports_a_transform_that_fails_in_threads() -> None:
    def fails_off_the_main_thread(c: DecodedChunk) -> DecodedChunk:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("not thread-safe")
        return c

    chunk = DecodedChunk(ChunkRead("t", 0), np.zeros((2, 3), "f4"), 0)
    with pytest.raises(RuntimeError, match="raised in a probe thread.*not thread-safe"):
        gil_probe(fails_off_the_main_thread, chunk, threads=2)


def test_the_report_never_claims_more_cpus_busy_than_the_machine_has() -> None:
    """4 threads on a 2-CPU machine may measure ~3.9: the line says what that is, beside the CPU count."""
    from insitubatch.tools.gil_probe import ProbeResult

    probe = ProbeResult("schedstat", threads=4, parallelism=3.9, threshold=1.9, samples=4, call_s=0.005, cpus=2)
    text = probe.describe()
    assert "3.90 of 4 threads progressed in parallel whenever they had a CPU" in text
    assert "(time waiting for one of this machine's 2 CPUs excluded)" in text
    assert "busy at once" not in text
    wall = ProbeResult("wall-clock", threads=2, parallelism=1.8, threshold=1.3, samples=4, call_s=0.005, cpus=2)
    assert wall.describe() == "2 threads did 1.80x the work of one (2 CPUs)"
    chunk = DecodedChunk(ChunkRead("t", 0), np.full((4, 64, 64), 300.0, "f4"), 0)
    measured = gil_probe(kelvin_to_celsius, chunk, threads=4)
    assert measured is None or measured.cpus == _usable_cpus()
