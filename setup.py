"""Build the Cython kernels in ``_ext/`` into ``insitubatch._ext.*``.

Compiler directives live here once. ``INSITUBATCH_DEBUG_KERNELS=1`` turns
bounds/wraparound checks back on and drops optimisation, for debugging a kernel.
``INSITUBATCH_OPENMP=1`` builds with OpenMP, so the gather copies a batch's
runs on several threads; without it the same code runs on the calling thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("INSITUBATCH_DEBUG_KERNELS") == "1"

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
}
OPENMP = os.environ.get("INSITUBATCH_OPENMP") == "1"
COMPILE_ARGS = (["-O0", "-g"] if DEBUG else ["-O3"]) + (["-fopenmp"] if OPENMP else [])
LINK_ARGS = ["-fopenmp"] if OPENMP else []

extensions = [
    Extension(
        f"insitubatch._ext.{pyx.stem}",
        [str(pyx)],
        include_dirs=[numpy.get_include()],
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=LINK_ARGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for pyx in sorted(Path("_ext").glob("*.pyx"))
]

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES, include_path=["_ext"]))
