"""What to paste into a bug report: versions, the built kernels and their flags, CPUs, free threading.

Versions come from package metadata, so torch and JAX are reported without
being imported. The kernels' build flags were recorded by ``setup.py`` when
they were compiled (``insitubatch/_ext/_build.py``, a generated file).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
import sysconfig
from typing import IO, Any

from .. import config
from ..validation import Anything, Table, validate_params

__all__ = ["debug_info", "print_debug_info"]

PACKAGES = ("insitubatch", "numpy", "zarr", "numcodecs", "obstore", "torch", "jax", "fsspec", "icechunk", "cython")
# environment variables that change how insitubatch or its kernels behave
ENVIRONMENT = (*(s.variable for s in config.SETTINGS.values()), *config.BUILD_VARIABLES, "OMP_NUM_THREADS")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_line() -> str:
    """``insitubatch X.Y.Z`` (``0+unknown`` from a source tree that was never installed), for ``--version``."""
    return f"insitubatch {_version('insitubatch') or '0+unknown'}"


def _kernels() -> dict[str, Any]:
    try:
        build = importlib.import_module("insitubatch._ext._build")
    except ImportError:
        return {"recorded": False, "note": "no build record: rebuild with `python setup.py build_ext --inplace`"}
    found = {name: importlib.util.find_spec(f"insitubatch._ext.{name}") is not None for name in build.KERNELS}
    return {
        "recorded": True,
        "built": sorted(name for name, ok in found.items() if ok),
        "missing": sorted(name for name, ok in found.items() if not ok),
        "openmp": build.OPENMP,
        "debug": build.DEBUG,
        "compile_args": list(build.COMPILE_ARGS),
        "cython": build.CYTHON,
        "numpy_at_build": build.NUMPY,
    }


def _gil_enabled() -> bool:
    check = getattr(sys, "_is_gil_enabled", None)  # Python 3.13+; before it the GIL is always on
    return bool(check()) if check is not None else True


def debug_info() -> dict[str, Any]:
    """The facts :func:`print_debug_info` prints, as a JSON-able dict."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "kernels": _kernels(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(affinity) if affinity is not None else os.cpu_count(),
        "free_threading_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": _gil_enabled(),
        "environment": {name: os.environ[name] for name in ENVIRONMENT if name in os.environ},
    }


# What ``print_debug_info`` accepts (``validation``)
DEBUG_PARAMETERS: Table = {"file": [Anything("a text stream with write(), or None for stdout")]}


@validate_params(DEBUG_PARAMETERS)
def print_debug_info(file: IO[str] | None = None) -> None:
    """Print versions, built kernels and flags, CPU count and free-threading state, for a bug report."""
    info = debug_info()
    out = file if file is not None else sys.stdout
    lines = [f"python        {info['python']} ({info['implementation']}) on {info['platform']}"]
    for name, version in info["packages"].items():
        lines.append(f"{name:<13} {version if version is not None else 'not installed'}")
    k = info["kernels"]
    if k["recorded"]:
        lines.append(
            f"kernels       {', '.join(k['built']) or 'none'}"
            + (f" (missing: {', '.join(k['missing'])})" if k["missing"] else "")
        )
        lines.append(
            f"build flags   openmp={k['openmp']} debug={k['debug']} args={' '.join(k['compile_args'])} "
            f"cython={k['cython']} numpy={k['numpy_at_build']}"
        )
    else:
        lines.append(f"kernels       {k['note']}")
    lines.append(f"cpus          {info['cpu_count']} ({info['usable_cpus']} usable by this process)")
    lines.append(f"free-threading build={info['free_threading_build']} gil_enabled={info['gil_enabled']}")
    for name, value in info["environment"].items():
        lines.append(f"env           {name}={value}")
    print("\n".join(lines), file=out)
