"""``insitubatch inspect URL``: what a store looks like to the loader, and what given knobs cost.

For each data variable: shape, dtype, the stored chunk (the unit of one
GET), tiles per sample-axis chunk, samples per chunk, and the decoded MB of
a chunk and of a tile (plus the stored, encoded size of the first tile when
``probe`` is on: one ``HEAD``-sized request per variable). For the knobs
(``batch_size``, ``block_chunks``, ``max_inflight``, ``prefetch_depth``) it
plans one shuffled epoch of a split with :func:`insitubatch.plan.plan_epoch`
and prints the working set (the pool's floor), the read-ahead bound,
GETs per epoch, the read concurrency and the memory they add up to.
Nothing is fetched but metadata (and the probes).
"""

from __future__ import annotations

import argparse
import inspect as _pyinspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from zarr.abc.store import Store

from ._zarr_compat import sync
from .geometry import ArrayGeometry, open_geometries
from .plan import plan_epoch
from .splits import DEFAULT_FRACTIONS, split_by_chunk
from .stores import as_store, close_store, obstore_store

__all__ = ["add_inspect_parser", "inspect_store", "run_inspect"]

MB = 1e6
# Below this many samples per shuffle block per batch, consecutive batches
# draw from few chunks; said as a hint, not an error.
MIN_BLOCK_SAMPLES_PER_BATCH = 4


def _dataset_defaults() -> dict[str, Any]:
    """The loader's own defaults for the knobs, read from ``InSituDataset`` (one place)."""
    from .dataset import InSituDataset

    params = _pyinspect.signature(InSituDataset).parameters
    return {k: params[k].default for k in ("batch_size", "block_chunks", "max_inflight", "prefetch_depth")}


def _mb(nbytes: float) -> str:
    return f"{nbytes / MB:.3f}" if nbytes < 10 * MB else f"{nbytes / MB:.1f}"


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
    max_inflight: int | None = None,
    prefetch_depth: int | None = None,
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
    given = {"batch_size": batch_size, "block_chunks": block_chunks, "max_inflight": max_inflight,
             "prefetch_depth": prefetch_depth}
    knobs = {k: defaults[k] if v is None else v for k, v in given.items()}
    for name, value in knobs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    opened = not isinstance(url_or_store, Store)
    if opened and storage_options:
        store = obstore_store(url_or_store, read_only=True, **storage_options)
    else:
        store = as_store(url_or_store)
    try:
        return _describe(store, url_or_store, knobs, variables, sample_axis, group, split, fractions, probe)
    finally:
        if opened:
            close_store(store)


def _describe(store: Store, where: Any, knobs: dict[str, int], variables: Sequence[str] | None, sample_axis: int,
              group: str, split: str, fractions: Any, probe: bool) -> str:
    geoms = open_geometries(store, sample_axis=sample_axis, variables=variables, group=group)
    if not geoms:
        raise ValueError(f"{where!r} has no data variables (only coordinates or nothing); name them with variables=")
    lengths = {p: g.n_samples for p, g in geoms.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"variables have different sample-axis lengths {lengths}; inspect them one at a time")
    label = where if isinstance(where, str) else type(where).__name__
    lines = [f"store      {label}", ""]
    header = (f"{'variable':<28} {'shape':<18} {'dtype':<8} {'stored chunk':<18} {'tiles':>5} "
              f"{'samples/chunk':>13} {'chunk MB':>9} {'tile MB':>9}" + (f" {'stored tile MB':>14}" if probe else ""))
    lines.append(header)
    encoded_ratio = []
    for path, g in geoms.items():
        row = (f"{path:<28} {str(g.shape):<18} {str(g.dtype):<8} {str(g.stored_chunks):<18} {g.tiles_per_chunk:>5} "
               f"{g.sample_chunk_size:>13} {_mb(g.chunk_nbytes):>9} {_mb(g.stored_chunk_nbytes):>9}")
        if probe:
            stored = _stored_nbytes(store, g)
            row += f" {(_mb(stored) if stored is not None else '-'):>14}"
            if stored:
                encoded_ratio.append(g.stored_chunk_nbytes / stored)
        lines.append(row)

    first = next(iter(geoms.values()))
    manifest = split_by_chunk(first, fractions=fractions)
    plan = plan_epoch(manifest, split, geoms, batch_size=knobs["batch_size"], block_chunks=knobs["block_chunks"],
                      shuffle=True, seed=0, epoch=0)
    tiles_per_read = {p: g.tiles_per_chunk for p, g in geoms.items()}
    gets = sum(tiles_per_read[path] for path, _ in plan.reads)
    sample_bytes = sum(g.sample_nbytes for g in geoms.values())
    batch_bytes = knobs["batch_size"] * sample_bytes
    tile_bytes = max(g.stored_chunk_nbytes for g in geoms.values())
    inflight_bytes = knobs["max_inflight"] * tile_bytes
    queue_bytes = (knobs["prefetch_depth"] + 1) * batch_bytes  # queued batches + the one being gathered
    spc = first.sample_chunk_size
    block_samples = knobs["block_chunks"] * spc
    lines += [
        "",
        "knobs      " + ", ".join(f"{k}={v}" for k, v in knobs.items()),
        f"epoch      split {split!r}: {plan.n_samples} samples, {plan.n_batches} batches, {plan.n_blocks} shuffle "
        f"blocks of {knobs['block_chunks']} chunks ({block_samples} samples each)",
        f"reads      {len(plan.reads)} chunk reads = {gets} GETs per epoch (each stored tile once); "
        f"{plan.n_samples / max(gets, 1):.2f} samples per GET",
        f"working    {_mb(plan.working_set_bytes)} MB resident at most ({plan.read_ahead_bound} chunk reads) — "
        f"the pool's floor and its automatic budget",
        f"in flight  {knobs['max_inflight']} tiles at once ≤ {_mb(inflight_bytes)} MB decoded"
        + (f" (~{_mb(inflight_bytes / (sum(encoded_ratio) / len(encoded_ratio)))} MB on the wire)" if encoded_ratio else ""),
        f"queue      {knobs['prefetch_depth']} batches ahead + 1 in assembly = {_mb(queue_bytes)} MB "
        f"({_mb(batch_bytes)} MB per batch)",
        f"memory     ≈ {_mb(plan.working_set_bytes + inflight_bytes + queue_bytes)} MB for the loader "
        "(working set + in flight + queue), before the interpreter",
    ]
    hints = []
    if spc == 1:
        hints.append("one sample per chunk: every GET serves one sample, so throughput is max_inflight / latency "
                     "samples per second at best; raise max_inflight")
    if block_samples < MIN_BLOCK_SAMPLES_PER_BATCH * knobs["batch_size"]:
        hints.append(f"a shuffle block holds {block_samples} samples, under {MIN_BLOCK_SAMPLES_PER_BATCH} batches: "
                     "raise block_chunks for a better shuffle")
    if math.prod(first.tile_grid) > 1:
        hints.append(f"chunks are split into {first.tiles_per_chunk} tiles: one sample-axis chunk costs that many GETs")
    lines += [f"hint       {h}" for h in hints]
    return "\n".join(lines)


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
    parser.add_argument("--max-inflight", type=int, default=None)
    parser.add_argument("--prefetch-depth", type=int, default=None)
    parser.add_argument("--variables", nargs="+", default=None, help="array paths (default: every data variable)")
    parser.add_argument("--sample-axis", type=int, default=0)
    parser.add_argument("--group", default="", help="group inside the store (default: root)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--anonymous", action="store_true", default=None, help="unsigned requests (public buckets)")
    parser.add_argument("--endpoint", default=None, help="custom object-store endpoint")
    parser.add_argument("--no-probe", dest="probe", action="store_false",
                        help="do not ask for each variable's stored chunk size")
    parser.set_defaults(run=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Run ``insitubatch inspect`` for parsed ``args``; prints the summary, returns 0."""
    options: dict[str, Any] = {}
    if args.anonymous:
        options["anonymous"] = True
    if args.endpoint is not None:
        options["endpoint"] = args.endpoint
    print(inspect_store(
        args.url, batch_size=args.batch_size, block_chunks=args.block_chunks, max_inflight=args.max_inflight,
        prefetch_depth=args.prefetch_depth, variables=args.variables, sample_axis=args.sample_axis,
        group=args.group, split=args.split, probe=args.probe, storage_options=options,
    ))
    return 0
