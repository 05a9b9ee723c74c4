"""The emulator as a user runs it: in the foreground until a signal, printing its URL, every setting an option."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from insitubatch.testing.emulator import Emulator
from insitubatch.testing.emulator.cli import build_parser
from insitubatch.tools.cli import build_parser as cli_parser

ROOT = Path(__file__).resolve().parents[2]
# Long enough that a GET which skipped the latency could not pass for one that waited.
LATENCY_S = 0.2
START_TIMEOUT_S = 60


@pytest.fixture
def served(tmp_path: Path) -> Path:
    (tmp_path / "bucket" / "ds.zarr").mkdir(parents=True)
    (tmp_path / "bucket" / "ds.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    (tmp_path / "bucket" / "ds.zarr" / "t2m").mkdir()  # an array of the group: not a dataset of its own
    (tmp_path / "bucket" / "ds.zarr" / "t2m" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array"}')
    return tmp_path


def _start(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    # stdin closed from the start: started with `&` from a shell, it must not take that for a stop
    return subprocess.Popen(
        [sys.executable, "-m", "insitubatch.testing.emulator", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_runs_in_the_foreground_until_a_signal(served: Path, stop: signal.Signals) -> None:
    proc = _start(str(served), "--latency-s", str(LATENCY_S), "--jitter-s", "0")
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        listed = proc.stdout.readline()
        assert f"{url}/bucket/ds.zarr" in listed and "s3://bucket/ds.zarr" in listed
        time.sleep(0.5)
        assert proc.poll() is None  # a closed stdin does not stop it
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{url}/bucket/ds.zarr/zarr.json", timeout=10) as resp:
            assert b"node_type" in resp.read()
        assert time.perf_counter() - t0 >= LATENCY_S  # the latency it was given applies
        proc.send_signal(stop)
        rest, err = proc.communicate(timeout=START_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert rest == ""  # one group listed; its arrays are not datasets
    assert "served 1 requests: 1 GETs" in err


def test_every_emulator_keyword_is_an_option_and_set_passes_the_rest(served: Path) -> None:
    parser = build_parser(Emulator)
    dests = {a.dest for a in parser._actions}
    keywords = [p.name for p in inspect.signature(Emulator).parameters.values() if p.kind is p.KEYWORD_ONLY]
    in_process = {"script", "tls", "record"}  # a callable, a context, a log: for code that runs it in-process
    assert keywords and set(keywords) - in_process <= dests and not in_process & dests
    args = parser.parse_args([str(served), "--latency-s", "0.5", "--set", "answer=42", "--set", "mode=slow"])
    assert args.latency_s == 0.5 and args.settings == [("answer", 42), ("mode", "slow")]
    with pytest.raises(SystemExit):
        parser.parse_args([str(served), "--set", "no equals sign"])
    # the same options under `insitubatch emulate`
    sub = cli_parser().parse_args(["emulate", str(served), "--latency-s", "0.5"])
    assert sub.latency_s == 0.5 and sub.root == str(served)


def test_a_setting_the_emulator_refuses_fails_in_one_line(served: Path) -> None:
    proc = _start(str(served), "--set", "no_such_setting=1")
    out, err = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no_such_setting" in err
    proc = _start(str(served / "missing"))
    _, err = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 1 and "is not a directory" in err
