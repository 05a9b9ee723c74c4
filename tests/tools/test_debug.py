"""``print_debug_info()`` and ``insitubatch debug-info``: what a bug report needs, without importing torch or JAX."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from insitubatch import print_debug_info
from insitubatch.tools.cli import main
from insitubatch.tools.debug import debug_info

ROOT = Path(__file__).resolve().parents[2]


def test_reports_versions_kernels_cpus_and_gil() -> None:
    out = io.StringIO()
    print_debug_info(out)
    text = out.getvalue()
    info = debug_info()
    assert info["python"] == sys.version.split()[0] and info["python"] in text
    for name in ("numpy", "zarr", "numcodecs", "obstore"):
        assert info["packages"][name] == version(name)
        assert f"{name:<13} {version(name)}" in text
    k = info["kernels"]
    assert k["recorded"] and k["missing"] == []
    assert set(k["built"]) == {p.stem for p in (ROOT / "_ext").glob("*.pyx")}
    assert isinstance(k["openmp"], bool) and isinstance(k["debug"], bool)
    assert f"openmp={k['openmp']} debug={k['debug']}" in text
    assert info["cpu_count"] == os.cpu_count() and f"cpus          {os.cpu_count()}" in text
    assert info["gil_enabled"] is (sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True)


def test_without_a_build_record_says_how_to_rebuild(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "insitubatch._ext._build", None)  # import now raises ImportError
    out = io.StringIO()
    print_debug_info(out)
    assert "no build record" in out.getvalue() and "build_ext" in out.getvalue()


def test_does_not_import_torch_or_jax() -> None:
    code = (
        "import sys, insitubatch; insitubatch.print_debug_info(); print('torch' in sys.modules, 'jax' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "False False"


def test_cli_prints_text_and_json(capsys) -> None:
    assert main(["debug-info"]) == 0
    assert "build flags" in capsys.readouterr().out
    assert main(["debug-info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["packages"]["zarr"] == version("zarr") and "free_threading_build" in data
