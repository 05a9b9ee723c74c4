"""insitubatch: shuffled tensor batches straight from chunked zarr in object storage."""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("insitubatch")
except _metadata.PackageNotFoundError:  # pragma: no cover - an unbuilt source tree on sys.path
    # no installed distribution to ask: say so rather than guess a release number
    __version__ = "0+unknown"

try:
    import insitubatch._ext.assemble as _assemble  # noqa: F401  (proves the kernels were built)
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    from .errors import BuildError

    raise BuildError(
        "insitubatch's compiled kernels are not built. From the source tree run "
        "`pip install -e .` (or `python setup.py build_ext --inplace`) and import again. "
        f"(underlying error: {exc})"
    ) from exc

from . import config  # noqa: F401  (`insitubatch.config.set(...)`, as `zarr.config`)
from ._engine.passes.batch import Batch
from ._engine.stats import PassStats
from .dataset import InSituDataset
from .errors import (
    BadChunkError,
    DatasetClosedError,
    InSituError,
    StoreReadError,
)
from .io.decode import read_stored_chunk
from .io.fill_scan import FillSteps, scan_fill_steps
from .io.geometry import ArrayGeometry
from .io.group import open_geometries, open_statics
from .io.sources.concat import concat_stores
from .io.sources.joined import join_stores
from .io.statics import StaticField
from .plan.dates import split_by_time
from .plan.epoch import shuffle_quality
from .plan.splits import DateRun, SplitDates, SplitManifest, split_by_chunk
from .stores.fsspec_stores import fsspec_store, icechunk_store
from .stores.obstore_stores import as_store, obstore_store
from .stores.owned import close_store
from .tools.debug import print_debug_info
from .transforms import DecodedChunk, applies
from .views import DatasetView

_LAZY = {name: "adapters" for name in ("JaxView", "TorchView", "as_torch", "to_jax", "to_torch")}
_LAZY["InSituDataModule"] = "adapters.lightning"  # Lightning is heavier still, and its own extra


def __getattr__(name: str):
    # the framework adapters import torch/jax, which a numpy-only user should not pay for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'insitubatch' has no attribute {name!r}")


__all__ = [
    "ArrayGeometry",
    "BadChunkError",
    "Batch",
    "DatasetClosedError",
    "DatasetView",
    "DateRun",
    "DecodedChunk",
    "FillSteps",
    "InSituDataModule",
    "InSituDataset",
    "InSituError",
    "JaxView",
    "PassStats",
    "SplitDates",
    "SplitManifest",
    "StaticField",
    "StoreReadError",
    "TorchView",
    "applies",
    "as_store",
    "as_torch",
    "close_store",
    "concat_stores",
    "fsspec_store",
    "icechunk_store",
    "join_stores",
    "obstore_store",
    "open_geometries",
    "open_statics",
    "print_debug_info",
    "read_stored_chunk",
    "scan_fill_steps",
    "shuffle_quality",
    "split_by_chunk",
    "split_by_time",
    "to_jax",
    "to_torch",
]
