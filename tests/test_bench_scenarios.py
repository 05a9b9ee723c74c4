"""The bench's one scenario concept (``bench.scenarios``): each link served from its own emulator, and the lists drawn from it.

``measure_each`` is the harness the report, the network scenarios and the
arena run through; here it serves real emulator processes on 127.0.0.1
and a real zarr group written by the generator.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bench.arena.scenarios import SCENARIOS as ARENA
from bench.network import MEASURES
from bench.network import SCENARIOS as NETWORK
from bench.scenarios import HTTP30, LOCAL, STRAGGLERS, Scenario, measure_each
from insitubatch.testing.data import wb2_64x32, write_era5_like
from insitubatch.testing.emulator import EmulatorProcess

SLOW_S = 0.2  # a first byte this late shows the link was the scenario's, not the emulator's default


def test_measure_each_serves_each_link_from_its_own_emulator_in_order(tmp_path: Path) -> None:
    spec = wb2_64x32(16)
    write_era5_like(tmp_path / spec.name, spec)
    slow = Scenario("slow", "http", {"latency_s": SLOW_S, "jitter_s": 0.0}, "HTTP at 200 ms")
    s3 = Scenario("s3-slow", "s3", {"latency_s": SLOW_S, "jitter_s": 0.0})
    seen: list[tuple[str, EmulatorProcess | None]] = []

    def measure(scenario: Scenario, emu: EmulatorProcess | None) -> dict[str, Any]:
        seen.append((scenario.name, emu))
        where = scenario.location(tmp_path, spec.name, emu)
        if emu is None:
            return {"where": where, "first_byte_s": None}
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{emu.url_for(spec.name)}/zarr.json", timeout=10) as resp:
            assert resp.status == 200 and resp.read()
        return {"where": where, "first_byte_s": time.perf_counter() - t0}

    logged: list[str] = []
    found = measure_each([LOCAL, slow, s3], tmp_path, measure, label="test", log=logged.append)
    assert list(found) == ["local", "slow", "s3-slow"] and [name for name, _ in seen] == list(found)
    assert logged == ["test: local (local files)", "test: slow (HTTP at 200 ms)", "test: s3-slow ()"]
    assert found["local"]["where"] == {"kind": "file", "path": str(tmp_path / spec.name)}
    http_emu, s3_emu = seen[1][1], seen[2][1]
    assert http_emu is not None and s3_emu is not None and http_emu is not s3_emu  # one emulator per scenario
    assert found["slow"]["where"] == {
        "kind": "http",
        "url": http_emu.url_for(spec.name),
        "path": str(tmp_path / spec.name),
    }
    assert found["s3-slow"]["where"]["kind"] == "s3" and found["s3-slow"]["where"]["endpoint"] == s3_emu.url
    assert found["slow"]["first_byte_s"] >= SLOW_S and found["s3-slow"]["first_byte_s"] >= SLOW_S
    assert http_emu.process.poll() is not None and s3_emu.process.poll() is not None  # each closed after its turn


def test_a_scenario_refuses_a_kind_it_cannot_serve_and_a_link_on_local_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"kind='ftp'"):
        Scenario("x", "ftp")
    with pytest.raises(ValueError, match=r"local files take no link"):
        Scenario("x", "file", {"latency_s": 0.03})
    with pytest.raises(ValueError, match=r"scenario 'local' reads local files"):
        LOCAL.emulator(tmp_path)


def test_the_report_lists_draw_their_links_from_the_one_table() -> None:
    assert list(ARENA) == ["local", "http0", "http30", "tail40", "stragglers", "s3"]
    assert list(NETWORK) == list(MEASURES) == ["tail", "stragglers", "throttle", "cpu", "stall", "sharded"]
    assert ARENA["stragglers"].link == NETWORK["stragglers"].link == STRAGGLERS.link
    assert NETWORK["stall"].link == NETWORK["sharded"].link == ARENA["http30"].link == HTTP30.link
    assert ARENA["tail40"].link["tail_s"] == NETWORK["tail"].link["tail_s"] > 0
    assert all(s.remote for s in NETWORK.values())
