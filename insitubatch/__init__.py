"""insitubatch: shuffled tensor batches straight from chunked zarr in object storage."""

from __future__ import annotations

try:
    from ._ext import assemble as _assemble  # noqa: F401  (proves the kernels were built)
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    from .errors import BuildError

    raise BuildError(
        "insitubatch's compiled kernels are not built. From the source tree run "
        "`pip install -e .` (or `python setup.py build_ext --inplace`) and import again. "
        f"(underlying error: {exc})"
    ) from exc

from .errors import InSituError, StoreReadError

__all__ = sorted(["InSituError", "StoreReadError"])
