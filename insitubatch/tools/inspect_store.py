"""``insitubatch inspect URL``: what a store looks like to the loader, and what given knobs cost.

For each data variable: shape, dtype, the stored chunk (the unit of one
GET), tiles per sample-axis chunk, samples per chunk, and the decoded MB of
a chunk and of a tile (plus the stored, encoded size of the first tile when
``probe`` is on: one ``HEAD``-sized request per variable). For the knobs
(``batch_size``, ``block_chunks``, ``max_inflight``, ``prefetch_depth``) it
plans one shuffled epoch of a split with :func:`insitubatch.plan.epoch.plan_epoch`
and prints the working set (the pool's floor), the read-ahead bound,
GETs per epoch, the read concurrency and the memory they add up to, for
``iterations`` passes open at once (the automatic pool budget is the sum of
their working sets). Nothing is fetched but metadata (and the probes).
"""

from __future__ import annotations

import argparse
import inspect as _pyinspect
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from zarr.abc.store import Store

from .._zarr_compat import sync
from ..io.geometry import ArrayGeometry
from ..io.group import open_geometries
from ..io.owned import close_store
from ..io.stores import as_store, obstore_store
from ..io.sync_get import _sync_get
from ..plan.cost import describe_loader, format_summary
from ..plan.epoch import plan_epoch
from ..plan.splits import DEFAULT_FRACTIONS, split_by_chunk

__all__ = ["add_inspect_parser", "inspect_store", "run_inspect"]


def _dataset_defaults() -> dict[str, Any]:
    """The loader's own defaults for the knobs, read from ``InSituDataset`` (one place)."""
    from ..dataset import InSituDataset

    params = _pyinspect.signature(InSituDataset).parameters
    return {k: params[k].default for k in ("batch_size", "block_chunks", "max_inflight", "prefetch_depth")}


def _int_or_auto(text: str) -> int | str:
    return text if text == "auto" else int(text)


def _stored_nbytes(store: Store, g: ArrayGeometry) -> int | None:
    """Encoded size of the variable's first stored chunk; ``None`` if it is missing or unknowable."""
    key = g.chunk_key(g.physical_chunk_coord(0, 0))
    try:
        return int(sync(store.getsize(key)))
    except (FileNotFoundError, NotImplementedError, OSError):
        return None
    except Exception:  # noqa: BLE001 - a backend's own "not found" types; the probe is optional
        return None


def inspect_store(
    url_or_store: Store | str,
    *,
    batch_size: int | None = None,
    block_chunks: int | None = None,
    max_inflight: int | Literal["auto"] | None = None,
    prefetch_depth: int | None = None,
    iterations: int = 1,
    variables: Sequence[str] | None = None,
    sample_axis: int = 0,
    group: str = "",
    split: str = "train",
    fractions: Sequence[float] | Mapping[str, float] = DEFAULT_FRACTIONS,
    probe: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """A human-readable summary of a store's variables and of an epoch's cost for the given knobs.

    Parameters
    ----------
    url_or_store
        A zarr ``Store`` or a URL / path (opened read-only with ``obstore_store``).
    batch_size, block_chunks, max_inflight, prefetch_depth
        The loader knobs; ``None`` takes ``InSituDataset``'s default.
        ``max_inflight="auto"`` states the in-flight memory at its cap.
    iterations
        Passes of this size open at once (``zip(ds.train, ds.val)`` is 2):
        each adds its working set to the automatic budget and its batches.
    variables
        Array paths to include; ``None`` is every data variable.
    sample_axis, group
        As in ``open_geometries``.
    split, fractions
        The split whose epoch is planned, from ``split_by_chunk(fractions=...)``.
    probe
        Ask the store for the encoded size of each variable's first stored chunk.
    storage_options
        Keyword options for ``obstore_store`` when ``url_or_store`` is a URL
        (``anonymous``, ``endpoint``, ...).

    Returns
    -------
    str
        Several lines, ready to print.

    Raises
    ------
    ValueError
        No data variables; variables whose sample-axis lengths differ; a bad knob.
    """
    defaults = _dataset_defaults()
    given = {
        "batch_size": batch_size,
        "block_chunks": block_chunks,
        "max_inflight": max_inflight,
        "prefetch_depth": prefetch_depth,
    }
    knobs = {k: defaults[k] if v is None else v for k, v in given.items()}
    for name, value in (*knobs.items(), ("iterations", iterations)):
        if name == "max_inflight" and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    opened = not isinstance(url_or_store, Store)
    store: Store
    if isinstance(url_or_store, str) and storage_options:
        store = obstore_store(url_or_store, read_only=True, **storage_options)
    else:
        store = as_store(url_or_store)
    try:
        return _describe(store, url_or_store, knobs, iterations, variables, sample_axis, group, split, fractions, probe)
    finally:
        if opened:
            close_store(store)


def _describe(
    store: Store,
    where: Any,
    knobs: dict[str, Any],
    iterations: int,
    variables: Sequence[str] | None,
    sample_axis: int,
    group: str,
    split: str,
    fractions: Any,
    probe: bool,
) -> str:
    geoms = open_geometries(store, sample_axis=sample_axis, variables=variables, group=group)
    if not geoms:
        raise ValueError(f"{where!r} has no data variables (only coordinates or nothing); name them with variables=")
    lengths = {p: g.n_samples for p, g in geoms.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"variables have different sample-axis lengths {lengths}; inspect them one at a time")
    first = next(iter(geoms.values()))
    manifest = split_by_chunk(first, fractions=fractions)
    plan = plan_epoch(
        manifest,
        split,
        geoms,
        batch_size=knobs["batch_size"],
        block_chunks=knobs["block_chunks"],
        shuffle=True,
        seed=0,
        epoch=0,
    )
    stored = {p: _stored_nbytes(store, g) for p, g in geoms.items()} if probe else None
    label = where if isinstance(where, str) else type(where).__name__
    info = describe_loader(
        geoms,
        {split: plan},
        knobs,
        split=split,
        store=label,
        stored_tile_bytes=stored,
        iterations=iterations,
        remote=_sync_get(store) is None,
    )
    return format_summary(info)


def add_inspect_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``inspect`` on an ``argparse`` subparsers object (``run=run_inspect``)."""
    parser = subparsers.add_parser(
        "inspect",
        help="show a store's variables, chunk and tile sizes, and an epoch's working set and read concurrency",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("url", help="store URL (gs://, s3://, http(s)://, file://) or a local path")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--block-chunks", type=int, default=None)
    parser.add_argument("--max-inflight", type=_int_or_auto, default=None, help='an int, or "auto" (the default)')
    parser.add_argument("--prefetch-depth", type=int, default=None)
    parser.add_argument(
        "--iterations", type=int, default=1, help="passes open at once, e.g. 2 for zip(ds.train, ds.val) (default: 1)"
    )
    parser.add_argument("--variables", nargs="+", default=None, help="array paths (default: every data variable)")
    parser.add_argument("--sample-axis", type=int, default=0)
    parser.add_argument("--group", default="", help="group inside the store (default: root)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--anonymous", action="store_true", default=None, help="unsigned requests (public buckets)")
    parser.add_argument("--endpoint", default=None, help="custom object-store endpoint")
    parser.add_argument(
        "--no-probe", dest="probe", action="store_false", help="do not ask for each variable's stored chunk size"
    )
    parser.set_defaults(run=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Run ``insitubatch inspect`` for parsed ``args``; prints the summary, returns 0."""
    options: dict[str, Any] = {}
    if args.anonymous:
        options["anonymous"] = True
    if args.endpoint is not None:
        options["endpoint"] = args.endpoint
    print(
        inspect_store(
            args.url,
            batch_size=args.batch_size,
            block_chunks=args.block_chunks,
            max_inflight=args.max_inflight,
            prefetch_depth=args.prefetch_depth,
            iterations=args.iterations,
            variables=args.variables,
            sample_axis=args.sample_axis,
            group=args.group,
            split=args.split,
            probe=args.probe,
            storage_options=options,
        )
    )
    return 0
