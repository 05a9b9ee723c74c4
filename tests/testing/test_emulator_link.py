"""The emulator's link model: heavy tail, stragglers, throttling bursts and GETs that are never answered."""

from __future__ import annotations

import http.client
import socket
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from insitubatch.testing.emulator import Emulator, EmulatorProcess
from insitubatch.testing.emulator.link import SLOWDOWN_BODY, LinkModel

BLOB = "data/blob.bin"
BLOB_NBYTES = 50_000
CLIENT_TIMEOUT_S = 10.0
DRAWS = 4000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / BLOB).write_bytes(np.random.default_rng(1).integers(0, 256, BLOB_NBYTES, dtype=np.uint8).tobytes())
    return tmp_path


def _get(emu, path: str = BLOB, timeout: float = CLIENT_TIMEOUT_S) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=timeout)
    try:
        conn.request("GET", "/" + path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _wait_for(predicate, timeout: float = CLIENT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the emulator never got there"
        time.sleep(0.01)


def test_the_delay_is_a_floor_plus_jitter_plus_an_exponential_tail_plus_stragglers() -> None:
    link = LinkModel(seed=3)
    link.configure(latency_s=0.04, jitter_s=0.01, tail_s=0.02, straggler_share=0.05, straggler_s=2.0)
    draws = [link.first_byte_delay() for _ in range(DRAWS)]
    delays = np.array([d for d, _ in draws])
    late = np.array([s for _, s in draws])
    assert delays.min() >= 0.04
    assert abs(late.mean() - 0.05) < 0.015
    assert (delays[late] >= 2.04).all() and (delays[~late] < 2.0).all()
    ordinary = delays[~late]
    # floor + mean jitter + the tail's mean; an exponential's median is ln 2 of its mean
    assert ordinary.mean() == pytest.approx(0.04 + 0.005 + 0.02, rel=0.1)
    assert statistics.median(ordinary - 0.04 - 0.005) == pytest.approx(0.02 * np.log(2), rel=0.2)
    assert np.percentile(ordinary, 99) > 0.04 + 0.01 + 4 * 0.02  # a heavy tail, far above the floor


def test_settings_are_checked_and_reported() -> None:
    link = LinkModel()
    link.configure(throttle_share=0.5, hold_key="a/*")
    assert link.settings()["throttle_share"] == 0.5 and link.settings()["hold_key"] == "a/*"
    with pytest.raises(TypeError, match="unknown link settings"):
        link.configure(latency=1.0)
    with pytest.raises(ValueError, match="straggler_share"):
        link.configure(straggler_share=1.5)
    with pytest.raises(ValueError, match="tail_s"):
        link.configure(tail_s=-1)
    assert link.held("a/b") and not link.held("b/a")
    link.configure(hold_times=2)
    assert [link.held("a/b") for _ in range(3)] == [True, True, False]  # a key that answers after two silences
    with pytest.raises(ValueError, match="hold_times"):
        link.configure(hold_times=0)


def test_throttle_bursts_throttle_only_inside_the_burst() -> None:
    link = LinkModel()
    link.configure(throttle_share=1.0)
    assert all(link.throttled() for _ in range(10))
    link.configure(throttle_period_s=3600.0, throttle_burst_s=3600.0)
    assert link.throttled()  # a new pattern starts with its burst
    link.configure(throttle_burst_s=0.0)
    assert not any(link.throttled() for _ in range(10))


def test_a_straggler_answers_late_and_is_counted(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0, straggler_share=1.0, straggler_s=0.3) as emu:
        t0 = time.perf_counter()
        status, body = _get(emu)
        assert time.perf_counter() - t0 >= 0.3
        assert status == 200 and len(body) == BLOB_NBYTES
        assert emu.stats().stragglers == 1


def test_throttling_answers_503_with_an_s3_slowdown_body(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0, throttle_share=1.0) as emu:
        status, body = _get(emu)
        assert status == 503 and body == SLOWDOWN_BODY and b"<Code>SlowDown</Code>" in body
        stats = emu.stats()
        assert stats.throttled == 1 and stats.keys[BLOB].faults == 1
        emu.configure(throttle_share=0.0)
        assert _get(emu)[0] == 200


def test_a_held_get_gets_no_byte_until_the_client_leaves(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0, hold_key=BLOB) as emu:
        t0 = time.perf_counter()
        with pytest.raises((socket.timeout, TimeoutError)):
            _get(emu, timeout=0.3)
        assert time.perf_counter() - t0 >= 0.3
        _wait_for(lambda: emu.stats().abandoned == 1)  # the server saw the client go and ended the hold
        assert emu.stats().held == 1 and emu.stats().keys[BLOB].abandoned == 1 and emu.stats().bytes_sent == 0
        emu.configure(hold_key=None)
        assert _get(emu)[0] == 200


def test_a_client_that_leaves_during_the_delay_is_counted_abandoned(root: Path) -> None:
    with Emulator(root, latency_s=5.0, jitter_s=0.0) as emu:
        with pytest.raises((socket.timeout, TimeoutError)):
            _get(emu, timeout=0.2)
        _wait_for(lambda: emu.stats().abandoned == 1, timeout=2.0)  # well before the 5 s delay ran out


def test_closing_ends_a_hold_at_once(root: Path) -> None:
    emu = Emulator(root, latency_s=0.0, hold_share=1.0)
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=CLIENT_TIMEOUT_S)
    conn.request("GET", "/" + BLOB)
    _wait_for(lambda: emu.stats().held == 1)
    t0 = time.perf_counter()
    emu.close()
    assert time.perf_counter() - t0 < 3.0
    conn.close()


def test_the_process_emulator_takes_link_settings(root: Path) -> None:
    with EmulatorProcess(root, latency_s=0.0, jitter_s=0.0, throttle_share=1.0) as emu:
        assert _get(emu)[0] == 503
        settings = emu.configure(throttle_share=0.0, tail_s=0.001)
        assert settings["tail_s"] == 0.001 and settings["throttle_share"] == 0.0
        assert _get(emu)[0] == 200
        assert emu.stats().throttled == 1
        with pytest.raises(ValueError, match="unknown link settings"):
            emu.configure(nonsense=1)
