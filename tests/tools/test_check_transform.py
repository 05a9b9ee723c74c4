"""``insitubatch-check-transform``: exit codes, the output_inner checks, the GIL-probe verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import smooth_field, write_array

from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.tools.check_transform import load_transform, main
from insitubatch.transforms import kelvin_to_celsius

KELVIN = "insitubatch.transforms:kelvin_to_celsius"
# user transforms, written to a file the CLI loads by path
PREP = '''
import dataclasses

import numpy as np

from insitubatch.transforms import Coarsen, Regrid, StandardScaler, kelvin_to_celsius
from insitubatch.transforms import applies

LAT = np.linspace(40.0, -40.0, 16)
LON = np.arange(32) * 11.25


def per_element_kelvin(chunk):
    """The transform not to write: one Python operation per element, GIL held throughout."""
    out = np.empty(chunk.data.shape, chunk.data.dtype)
    src, dst = chunk.data.reshape(-1), out.reshape(-1)
    for i in range(src.size):
        dst[i] = src[i] - 273.15
    return dataclasses.replace(chunk, data=out)


def numpy_kelvin(chunk):
    return dataclasses.replace(chunk, data=chunk.data - np.float32(273.15))


def halve_lat(chunk):
    """Reshapes, but declares no output_inner."""
    return dataclasses.replace(chunk, data=chunk.data[:, ::2])


class WrongDeclared:
    """Declares a quarter of the longitudes but returns half of them."""

    def output_inner(self, geometry):
        return (geometry.inner_shape[0], geometry.inner_shape[1] // 4), geometry.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data[:, :, ::2])


class NeedsArguments:
    def __init__(self, k):
        self.k = k

    def __call__(self, chunk):
        return chunk


def drop_a_sample(chunk):
    return dataclasses.replace(chunk, data=chunk.data[1:])


def in_place(chunk):
    chunk.data -= 273.15
    return chunk


def returns_array(chunk):
    return chunk.data


regrid = Regrid(LAT, LON, np.linspace(30.0, -30.0, 5), np.arange(0.0, 340.0, 20.0))
coarsen = Coarsen(2)
kelvin_on_u10 = applies(["u10"], kelvin_to_celsius)
class scaler_without_t2m:  # noqa: N801 - a mis-scoped scaler; applies() refuses it when the CLI builds it
    def __new__(cls):
        return applies(["t2m"], StandardScaler({"u10": 0.0}, {"u10": 1.0}))
'''


@pytest.fixture
def store_path(tmp_path) -> Path:
    """A small v3 group: t2m (40, 16, 32) in (8, 16, 16) stored chunks, so each chunk has two tiles."""
    rng = np.random.default_rng(3)
    root = zarr.open_group(tmp_path / "era5.zarr", mode="w")
    write_array(root, "t2m", 280 + smooth_field(rng, (40, 16, 32)), (8, 16, 16), dims=("time", "lat", "lon"))
    write_array(root, "u10", smooth_field(rng, (40, 16, 32)), (8, 16, 32), dims=("time", "lat", "lon"))
    return tmp_path / "era5.zarr"


@pytest.fixture
def prep(tmp_path) -> Path:
    path = tmp_path / "prep.py"
    path.write_text(PREP)
    return path


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


# -- exit codes and the output checks ---------------------------------------------------
def test_kelvin_to_celsius_passes_and_prints_the_geometry(capsys, store_path) -> None:
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", KELVIN, "--no-gil-probe")
    assert code == 0, out
    assert "shape (40, 16, 32) float32" in out
    assert "stored chunk (8, 16, 16): 8 samples per chunk, 5 chunks, 2 stored chunk(s)" in out
    assert "decoded      0.016 MB per chunk" in out
    assert "PASS output-inner" in out and "SKIP gil-probe    --no-gil-probe" in out
    assert "cache key    'insitubatch.kelvin_to_celsius/v1'" in out
    assert out.rstrip().endswith("verdict      PASS: 5 checks passed")


@pytest.mark.parametrize("attr", ["regrid", "coarsen"])
def test_declared_reshapes_pass(capsys, store_path, prep, attr) -> None:
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:{attr}", "--no-gil-probe")
    assert code == 0, out
    assert "PASS output-inner declared" in out


def test_undeclared_reshape_fails_naming_transform_and_shapes(capsys, store_path, prep) -> None:
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:halve_lat", "--no-gil-probe")
    assert code == 1
    assert (
        "FAIL output-inner halve_lat changed inner (16, 32) float32 to (8, 32) float32 without declaring output_inner"
        in out
    )
    assert "verdict      FAIL: 1 of" in out


def test_wrong_output_inner_fails_naming_both_shapes(capsys, store_path, prep) -> None:
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:WrongDeclared")
    assert code == 1
    assert (
        "WrongDeclared.output_inner declares inner (16, 8) float32 but the transform returned (16, 16) float32" in out
    )
    assert "SKIP gil-probe    an earlier check failed" in out


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("drop_a_sample", "FAIL sample-axis  drop_a_sample turned 8 samples into 7 samples"),
        ("returns_array", "FAIL returns      returns_array returned ndarray; a chunk transform returns a DecodedChunk"),
        (
            "kelvin_on_u10",
            "FAIL scope        applies(['u10'], KelvinToCelsius) is scoped to ['u10']; it would never run on 't2m'",
        ),
        ("scaler_without_t2m", "StandardScaler is scoped to ['t2m'], which it has no statistics for"),
        ("NeedsArguments", "FAIL load         --transform"),
        ("nothing_here", "has no 'nothing_here'"),
    ],
)
def test_broken_transforms_fail(capsys, store_path, prep, attr, message) -> None:
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:{attr}", "--no-gil-probe")
    assert code == 1, out
    assert message in out


def test_a_transform_gets_writable_data_like_in_the_engine(capsys, store_path, prep) -> None:
    """The engine decodes into an array the transform owns; the checker hands over the same kind."""
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:in_place", "--no-gil-probe")
    assert code == 0, out
    assert "PASS run          in_place ran on the chunk" in out


def test_store_and_argument_errors(capsys, store_path, tmp_path) -> None:
    code, out = _run(capsys, str(store_path), "--var", "nope", "--transform", KELVIN)
    assert code == 1 and "FAIL open" in out and "'nope' is not an array" in out
    code, out = _run(capsys, str(tmp_path / "missing.zarr"), "--var", "t2m", "--transform", KELVIN)
    assert code == 1 and "FAIL open" in out
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", KELVIN, "--chunk", "9", "--no-gil-probe")
    assert code == 1 and "FAIL read" in out and "chunk_index=9" in out
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", "no_colon")
    assert code == 1 and "must be module:attr or path/to/file.py:attr" in out
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", str(tmp_path / "absent.py") + ":f")
    assert code == 1 and "no file" in out
    assert _run(capsys, str(store_path), "--transform", KELVIN)[0] == 2  # --var is required
    assert _run(capsys, str(store_path), "--var", "t2m", "--transform", KELVIN, "--threads", "1")[0] == 2
    code, out = _run(capsys, "--help")
    assert code == 0 and "--no-gil-probe" in out


def test_load_transform_by_module_and_by_path(prep) -> None:
    transform, name = load_transform(KELVIN)
    assert transform is kelvin_to_celsius and name == "KelvinToCelsius"
    transform, name = load_transform(f"{prep}:WrongDeclared")
    assert callable(transform) and name == "WrongDeclared"  # the class was instantiated
    with pytest.raises(TypeError, match="cannot be built without arguments"):
        load_transform(f"{prep}:NeedsArguments")


# -- the GIL probe ------------------------------------------------------------------------
def test_gil_probe_flags_per_element_python_and_passes_numpy(capsys, store_path, prep) -> None:
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:per_element_kelvin")
    assert code == 1, out
    assert "FAIL gil-probe    per_element_kelvin holds the GIL" in out
    assert "verdict      FAIL: 1 of 6 checks failed (gil-probe)" in out
    code, out = _run(capsys, str(store_path), "--var", "t2m", "--transform", f"{prep}:numpy_kelvin")
    assert code == 0, out
    assert "PASS gil-probe    numpy_kelvin releases the GIL" in out


# -- as a process, and against a loopback object store ----------------------------------------
def test_runs_as_a_process_with_exit_codes(store_path, prep) -> None:
    base = [
        sys.executable,
        "-m",
        "insitubatch.tools.check_transform",
        str(store_path),
        "--var",
        "t2m",
        "--no-gil-probe",
    ]
    ok = subprocess.run([*base, "--transform", KELVIN], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verdict      PASS" in ok.stdout
    bad = subprocess.run([*base, "--transform", f"{prep}:halve_lat"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL output-inner" in bad.stdout


def test_reads_from_a_loopback_s3_endpoint(capsys, monkeypatch, s3_server, s3_bucket, store_path) -> None:
    options = s3_server.client_options()
    url = f"s3://{s3_bucket}/era5.zarr"
    target = zarr.open_group(obstore_store(url, **options), mode="w")
    t2m = zarr.open_group(store_path, mode="r")["t2m"]
    write_array(target, "t2m", t2m[:], t2m.chunks, dims=("time", "lat", "lon"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret_access_key"])
    monkeypatch.setenv("AWS_REGION", options["region"])
    base = [
        url,
        "--var",
        "t2m",
        "--transform",
        KELVIN,
        "--no-gil-probe",
        "--endpoint",
        s3_server.endpoint,
        "--allow-http",
    ]
    code, out = _run(capsys, *base, "--request-payer")
    assert code == 0, out
    assert "read         chunk 0: (8, 16, 32) from 2 stored chunk(s)" in out
    # unsigned requests reach the server and are refused by the private bucket
    code, out = _run(capsys, *base, "--anonymous")
    assert code == 1 and "FAIL open" in out and "403" in out
    assert len([line for line in out.splitlines() if line.startswith("FAIL")]) == 1
    assert "Debug source" not in out and "Traceback" not in out  # one line, not the backend's debug dump
