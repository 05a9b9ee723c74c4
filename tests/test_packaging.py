"""The sdist carries what setup.py needs to compile the kernels on a machine that has only it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

# the packaging front end (dev extra); its submodule, so setuptools' build/ output folder,
# importable as a namespace package from the repository root, does not pass for it
pytest.importorskip("build.__main__")

ROOT = Path(__file__).resolve().parents[1]
# What a clean clone lacks or the sdist never needs: build outputs, venvs, the non-package trees.
NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".ci-venv",
    "build",
    "dist",
    "*.egg-info",
    "*.so",
    "*.c",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    "demo_data",
    "bench",
    "docs",
    "examples",
    "tests",
)


@pytest.mark.slow
def test_sdist_ships_the_cython_sources(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=NOT_COPIED)
    out = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the license is an SPDX expression with its file: setuptools' warning about the table form is gone
    assert "License classifiers are deprecated" not in proc.stdout + proc.stderr
    assert "project.license" not in proc.stdout + proc.stderr
    (archive,) = out.glob("insitubatch-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = {str(p.relative_to(ROOT)) for pattern in ("*.pyx", "*.pxd", "*.h") for p in (ROOT / "_ext").glob(pattern)}
    assert any(name.endswith(".pxd") for name in wanted)
    assert wanted <= names, f"the sdist lacks {sorted(wanted - names)}"
    assert {"setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE"} <= names
    with tarfile.open(archive) as tar:
        (pkg_info,) = [m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        metadata = tar.extractfile(pkg_info).read().decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert not [n for n in names if n.endswith((".so", ".c"))], "build outputs in the sdist"
