"""The benchmark's loopback object store: latency, counters, Range, bandwidth, faults, and the report smoke run."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from insitubatch.io.group import open_geometries
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.testing.data import DatasetSpec, write_era5_like
from insitubatch.testing.emulator import FAULT_KINDS, Emulator, EmulatorProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOB = "data/blob.bin"
BLOB_NBYTES = 200_000
LATENCY_S = 0.05
# The smoke run of the report must fit a CI minute (issue: "under a minute").
QUICK_REPORT_BUDGET_S = 60.0
CLIENT_TIMEOUT_S = 10.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    payload = np.random.default_rng(0).integers(0, 256, BLOB_NBYTES, dtype=np.uint8).tobytes()
    (tmp_path / BLOB).write_bytes(payload)
    return tmp_path


def _request(
    emu: Emulator,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    timeout: float = CLIENT_TIMEOUT_S,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=timeout)
    try:
        conn.request(method, "/" + path.lstrip("/"), headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_every_get_waits_at_least_the_latency(root: Path) -> None:
    with Emulator(root, latency_s=LATENCY_S, jitter_s=0.01) as emu:
        for _ in range(5):
            t0 = time.perf_counter()
            status, _, body = _request(emu, BLOB)
            assert time.perf_counter() - t0 >= LATENCY_S
            assert status == 200 and len(body) == BLOB_NBYTES


def test_zero_latency_is_fast(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        t0 = time.perf_counter()
        for _ in range(10):
            _request(emu, BLOB)
        # ten requests with no injected delay (and Nagle off) take far less than one 40 ms delayed ACK each
        assert time.perf_counter() - t0 < 10 * 0.04


def test_counts_are_exact_per_key(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        for _ in range(3):
            _request(emu, BLOB)
        _request(emu, BLOB, headers={"Range": "bytes=0-99"})
        _request(emu, BLOB, method="HEAD")
        status, _, _ = _request(emu, "data/missing")
        assert status == 404
        stats = emu.stats()
        assert stats.gets == 5 and stats.heads == 1 and stats.requests == 6 and stats.not_found == 1
        blob = stats.keys[BLOB]
        assert (blob.gets, blob.heads, blob.bytes_sent) == (4, 1, 3 * BLOB_NBYTES + 100)
        assert stats.keys["data/missing"].gets == 1
        assert stats.gets_where(lambda k: k == BLOB) == 4
        emu.reset_stats()
        assert emu.stats().requests == 0 and not emu.stats().keys


def test_range_requests(root: Path) -> None:
    data = (root / BLOB).read_bytes()
    with Emulator(root, latency_s=0.0) as emu:
        status, headers, body = _request(emu, BLOB, headers={"Range": "bytes=10-19"})
        assert status == 206 and body == data[10:20]
        assert headers["Content-Range"] == f"bytes 10-19/{BLOB_NBYTES}"
        assert _request(emu, BLOB, headers={"Range": "bytes=-5"})[2] == data[-5:]
        assert _request(emu, BLOB, headers={"Range": f"bytes={BLOB_NBYTES - 7}-"})[2] == data[-7:]
        assert _request(emu, BLOB, headers={"Range": f"bytes={BLOB_NBYTES}-"})[0] == 416
        status, headers, body = _request(emu, BLOB, method="HEAD")
        assert status == 200 and body == b"" and headers["Content-Length"] == str(BLOB_NBYTES)


def test_paths_outside_the_root_are_not_served(root: Path) -> None:
    (root.parent / "secret.txt").write_text("no")
    with Emulator(root, latency_s=0.0) as emu:
        assert _request(emu, "../secret.txt")[0] == 404
        assert _request(emu, "data")[0] == 404  # a directory is not an object


def test_bandwidth_paces_the_body(root: Path) -> None:
    rate = 1_000_000.0
    with Emulator(root, latency_s=0.0, jitter_s=0.0, bandwidth_bytes_per_s=rate) as emu:
        t0 = time.perf_counter()
        _, _, body = _request(emu, BLOB)
        elapsed = time.perf_counter() - t0
    assert len(body) == BLOB_NBYTES
    # the last slice may go out without its wait, so allow one slice of slack
    assert elapsed >= (BLOB_NBYTES - 64 * 1024) / rate


@pytest.mark.parametrize("kind,status", [("500", 500), ("503", 503), ("403", 403), ("404", 404)])
def test_status_faults(root: Path, kind: str, status: int) -> None:
    with Emulator(root, latency_s=0.0) as emu:
        fault = emu.inject(kind, BLOB, times=1)
        assert _request(emu, BLOB)[0] == status
        assert _request(emu, BLOB)[0] == 200  # times=1: it fired once
        assert fault.fired == 1 and emu.stats().faults == 1 and emu.stats().keys[BLOB].faults == 1


def test_retry_after_fault(root: Path) -> None:
    with Emulator(root, latency_s=0.0) as emu:
        emu.inject("retry-after", retry_after_s=7)
        status, headers, _ = _request(emu, BLOB)
        assert status == 503 and headers["Retry-After"] == "7"


def test_truncate_fault_sends_a_short_body(root: Path) -> None:
    with Emulator(root, latency_s=0.0) as emu:
        emu.inject("truncate", BLOB)
        with pytest.raises(http.client.IncompleteRead) as info:
            _request(emu, BLOB)
        assert len(info.value.partial) == BLOB_NBYTES // 2


def test_reset_fault_resets_the_connection_mid_body(root: Path) -> None:
    with Emulator(root, latency_s=0.0) as emu:
        emu.inject("reset", BLOB)
        with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
            _request(emu, BLOB)
        assert emu.stats().keys[BLOB].bytes_sent == BLOB_NBYTES // 2


def test_stall_fault_trips_a_client_timeout_and_close_ends_it(root: Path) -> None:
    emu = Emulator(root, latency_s=0.0)
    emu.inject("stall", BLOB, stall_s=60.0)
    try:
        with pytest.raises((socket.timeout, TimeoutError)):
            _request(emu, BLOB, timeout=0.5)
    finally:
        t0 = time.perf_counter()
        emu.close()
        assert time.perf_counter() - t0 < 5.0  # the stalled handler was woken, not waited out


def test_fault_rules_match_keys_and_probability(root: Path) -> None:
    (root / "data" / "other.bin").write_bytes(b"x" * 10)
    with Emulator(root, latency_s=0.0, seed=1) as emu:
        emu.inject("500", "data/oth*")
        emu.inject("503", probability=0.0)
        assert _request(emu, "data/other.bin")[0] == 500
        assert _request(emu, BLOB)[0] == 200
        emu.clear_faults()
        assert _request(emu, "data/other.bin")[0] == 200
        with pytest.raises(ValueError, match="kind="):
            emu.inject("teapot")
    assert set(FAULT_KINDS) == {"500", "503", "403", "404", "retry-after", "reset", "truncate", "stall"}


def test_obstore_zarr_reads_through_the_emulator_exactly(tmp_path: Path) -> None:
    spec = DatasetSpec(n_time=24, n_lat=8, n_lon=16, samples_per_chunk=4, inner_tiles=(1, 2))
    local = write_era5_like(tmp_path / spec.name, spec)
    with Emulator(tmp_path, latency_s=0.0) as emu:
        store = obstore_store(emu.url_for(spec.name), read_only=True)
        geoms = open_geometries(store)
        assert sorted(geoms) == sorted(spec.variables)
        emu.reset_stats()
        remote = zarr.open_array(store, path=spec.variables[0], mode="r")[4:8]
        expected = zarr.open_array(local, path=spec.variables[0], mode="r")[4:8]
        np.testing.assert_array_equal(remote, expected)
        # one time chunk, two spatial tiles: two chunk GETs (plus the array's metadata)
        chunk_gets = emu.stats().gets_where(lambda k: "/c." in k)
        assert chunk_gets == 2


@pytest.mark.parametrize("codec", ["zstd", "blosc-zstd"])
def test_generated_chunks_are_the_bytes_zarr_writes(tmp_path: Path, codec: str) -> None:
    """The generator's fast chunk writer stores what zarr itself would, edge chunks included."""
    spec = DatasetSpec(
        n_time=10,
        n_lat=9,
        n_lon=14,
        variables=("2m_temperature",),
        samples_per_chunk=4,
        inner_tiles=(2, 3),
        codec=codec,
    )
    path = write_era5_like(tmp_path / spec.name, spec)
    ours = zarr.open_array(path, path="2m_temperature", mode="r")
    assert type(ours.compressors[0]) is type(spec.zarr_compressor())
    again = zarr.create_array(
        tmp_path / "by_zarr.zarr",
        shape=ours.shape,
        chunks=ours.chunks,
        dtype=ours.dtype,
        compressors=ours.compressors,
        fill_value=ours.fill_value,
        chunk_key_encoding=ours.metadata.chunk_key_encoding,
    )
    again[:] = ours[:]
    keys = sorted(p.name for p in (path / "2m_temperature").glob("c.*"))
    assert len(keys) == 3 * 2 * 3  # every chunk of the grid, edge ones included
    for key in keys:
        assert (path / "2m_temperature" / key).read_bytes() == (tmp_path / "by_zarr.zarr" / key).read_bytes(), key


def test_dataset_spec_rejects_an_unknown_codec() -> None:
    with pytest.raises(ValueError, match="codec='lz4'"):
        DatasetSpec(n_time=16, codec="lz4")  # type: ignore[arg-type]


def test_sharded_dataset_round_trips(tmp_path: Path) -> None:
    spec = DatasetSpec(n_time=16, n_lat=8, n_lon=8, variables=("2m_temperature",), samples_per_chunk=2, shard_samples=8)
    path = write_era5_like(tmp_path / spec.name, spec)
    arr = zarr.open_array(path, path="2m_temperature", mode="r")
    assert arr.shards == (8, 8, 8) and arr.chunks == (2, 8, 8)
    values = arr[:]
    assert np.isfinite(values).all() and 200 < values.mean() < 350


def test_emulator_process_control_endpoints(root: Path) -> None:
    with EmulatorProcess(root, latency_s=0.0) as emu:
        conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=CLIENT_TIMEOUT_S)
        conn.request("GET", "/" + BLOB)
        assert len(conn.getresponse().read()) == BLOB_NBYTES
        conn.close()
        # the server counts a body once its write returns, which can be just after the client has it all
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while (stats := emu.stats()).keys[BLOB].bytes_sent < BLOB_NBYTES and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stats.gets == 1 and stats.keys[BLOB].bytes_sent == BLOB_NBYTES
        assert emu.configure(latency_s=0.02)["latency_s"] == 0.02
        emu.reset_stats()
        assert emu.stats().requests == 0
    assert emu.process.poll() is not None


@pytest.mark.slow
def test_quick_report_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the report's DataLoader baselines
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * QUICK_REPORT_BUDGET_S,
    )
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["elapsed_s"] < QUICK_REPORT_BUDGET_S, elapsed
    assert (out / "report.md").is_file()
    main = results["tables"][str(results["meta"]["main_spc"])]
    names = {row["name"] for row in main}
    assert {
        "dataloader-0",
        "zarr-contiguous",
        "insitu-cold",
        "insitu-warm-memory",
        "decode-ceiling",
        "get-ceiling",
    } <= names
    for row in main:
        assert not row.get("error"), row
        assert row["rate_samples_per_s"] > 0
        assert {"peak_rss_mb", "gets", "spc", "wall_s"} <= set(row)
    cold = next(r for r in main if r["name"] == "insitu-cold")
    assert cold["gets"] == cold["min_gets"] == cold["insitu_gets"]
    assert cold["ttfb_s"] > 0 and cold["complete_epoch"]
    warm = next(r for r in main if r["name"] == "insitu-warm-memory")
    assert warm["gets"] == 0 and warm["hits"] > 0
    ratios = results["ratios"][str(results["meta"]["main_spc"])]
    assert ratios["over_best_dataloader"] > 0 and 0 < ratios["fraction_of_decode_ceiling"]
    assert results["findings"]["fork"] and results["findings"]["fork"][0]["outcome"] in ("hang", "raised", "ok")
    assert {b["bar"] for b in results["bars"]}
    memory = results["memory"]  # a cold pass over a split several times the budget, beside inspect's bound
    assert not memory.get("error"), memory
    assert memory["inspect_bound_mb"] > 0 and memory["peak_rss_mb"] > 0 and memory["complete_epoch"]
    assert "## Memory: a cold pass over a split many times the pool budget" in (out / "report.md").read_text()
    assert results["sweeps"]["samples_per_chunk"] and results["sweeps"]["max_inflight"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert results["plots"] == []
    else:
        assert len(results["plots"]) == 4 and all(Path(p).is_file() for p in results["plots"])
