"""Finding the arena's peers: the reference's own virtual environment (made on first use) and TensorStore.

Each function returns ``(what to run with, None)`` or ``(None, why not)``:
a peer that cannot run here (no Python 3.12, no network to install from,
TensorStore not installed) is a skipped row with that reason, never a crash.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .reference import REFERENCE_VERSION

__all__ = ["REFERENCE_REQUIREMENT", "find_python312", "reference_python", "tensorstore_available"]

REFERENCE_REQUIREMENT = f"insitubatch=={REFERENCE_VERSION}"
# The reference's Requires-Python (and zarr >= 3.3, which needs it too).
MIN_PYTHON = (3, 12)
# Creating the venv and installing the reference with its dependencies (zarr, numcodecs, obstore, xarray, ...).
INSTALL_TIMEOUT_S = 600
PROBE_TIMEOUT_S = 60
_PROBE = "import insitubatch, json; print(json.dumps([insitubatch.__version__, insitubatch.__file__]))"


def _version_of(python: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    parts = out.stdout.split()
    return tuple(int(p) for p in parts) if out.returncode == 0 and len(parts) == 2 else None


def find_python312() -> str | None:
    """An interpreter of Python >= 3.12: pyenv's 3.12.x/3.13.x, else ``python3.12``/``python3.13`` on PATH."""
    candidates: list[str] = []
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        try:
            bare = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=30).stdout
            root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            bare, root = "", ""
        for series in ("3.12", "3.13"):  # the oldest the reference supports first: what it was written on
            for name in sorted(bare.split(), reverse=True):
                if name.startswith(series + ".") and root:
                    candidates.append(str(Path(root) / "versions" / name / "bin" / "python"))
    candidates += [p for p in (shutil.which("python3.12"), shutil.which("python3.13")) if p]
    for python in candidates:
        version = _version_of(python)
        if version is not None and version >= MIN_PYTHON:
            return python
    return None


def _probe(python: Path, repo_root: Path) -> str | None:
    """Why ``python`` is not the reference's interpreter, or ``None`` when it is (isolated: ours is not on its path)."""
    try:
        out = subprocess.run([str(python), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python} did not run: {exc}"
    if out.returncode != 0:
        return f"{python} cannot import the reference: {out.stderr.strip().splitlines()[-1:] or out.returncode}"
    version, where = json.loads(out.stdout)
    if version != REFERENCE_VERSION:
        return f"{python} has insitubatch {version}, not {REFERENCE_VERSION}"
    if (repo_root / "insitubatch").resolve() in Path(where).resolve().parents:
        return f"{python} imports this repository's insitubatch ({where}), not the reference"
    return None


def reference_python(
    venv: Path, repo_root: Path, *, base_python: str | None = None, log: Callable[[str], None] = print
) -> tuple[str | None, str | None]:
    """The reference's interpreter in ``venv``, made and installed there first if need be; or why there is none."""
    python = venv / "bin" / "python"
    if python.exists() and _probe(python, repo_root) is None:
        return str(python), None
    try:
        if not python.exists():
            base = base_python or find_python312()
            if base is None:
                return None, "no Python >= 3.12 found (pyenv or python3.12 on PATH); the reference needs it"
            log(f"arena: making the reference's venv at {venv} with {base}")
            venv.parent.mkdir(parents=True, exist_ok=True)
            made = subprocess.run(
                [base, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
            if made.returncode != 0:
                return None, f"{base} -m venv {venv} failed: {made.stderr.strip()[-300:]}"
        log(f"arena: pip install {REFERENCE_REQUIREMENT} into {venv}")
        install_log = venv / "arena-install.log"
        with install_log.open("w") as f:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", REFERENCE_REQUIREMENT],
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=INSTALL_TIMEOUT_S,
            )
    except (OSError, subprocess.SubprocessError) as exc:  # no such interpreter, a timeout, an unwritable path
        return None, f"could not make the reference's venv at {venv}: {type(exc).__name__}: {exc}"
    if done.returncode != 0:
        return None, f"pip install {REFERENCE_REQUIREMENT} failed (no network to PyPI?); see {install_log}"
    why = _probe(python, repo_root)
    return (None, why) if why else (str(python), None)


def tensorstore_available() -> str | None:
    """Why TensorStore cannot run here (not installed in this environment), or ``None``."""
    if importlib.util.find_spec("tensorstore") is None:
        return f"tensorstore is not installed in {sys.prefix} (pip install 'insitubatch[bench]')"
    return None
