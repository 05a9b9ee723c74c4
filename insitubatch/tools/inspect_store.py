"""``insitubatch inspect URL``: what a store looks like to the loader, and what given knobs cost.

For each data variable: shape, dtype, the stored chunk (the unit of one
GET), tiles per sample-axis chunk, samples per chunk, and the decoded MB of
a chunk and of a tile (plus the stored, encoded size of the first tile when
``probe`` is on: one ``HEAD``-sized request per variable). For the knobs
(``batch_size``, ``block_chunks``, ``max_inflight``, ``prefetch_depth``) it
plans one shuffled epoch of a split with :func:`insitubatch.plan.epoch.plan_epoch`
and prints the working set (the pool's floor), the read-ahead bound,
GETs per epoch (``InSituDataset.describe()``'s count: a sharded array's
shard indexes and runs of inner chunks included), the GETs a remote
dataset sends as it opens, the read concurrency and the memory they add up to, for
``iterations`` passes open at once (the automatic pool budget is the sum of
their working sets), and which HTTP client reads the chunks, and why.
Nothing is fetched but metadata (and the probes).

With ``latency_ms`` (``--latency-ms``) it also turns a link's time to first
byte into the read ceiling of those knobs (:func:`insitubatch.plan.cost.read_ceiling`)
and names the knob that sets it: ``max_inflight``, or the read-ahead of
``block_chunks``, with the value that would lift it.
"""

from __future__ import annotations

import argparse
import inspect as _pyinspect
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from zarr.abc.store import Store

from .._engine.passes.context import read_sources
from .._engine.reads.concurrency import AUTO_START
from .._engine.reads.shard_index import SHARD_INDEX_BUDGET_BYTES, held_index_bytes, plan_shards
from .._engine.reads.shard_runs import pass_reads
from .._zarr_compat import sync
from ..io.decode import shard_stage
from ..io.geometry import ArrayGeometry
from ..io.group import open_geometries, scan_group
from ..io.statics import StaticField
from ..io.sync_get import sync_get
from ..plan.cost import describe_loader, format_summary, read_ceiling
from ..plan.epoch import EpochPlan, plan_epoch
from ..plan.sizing import READ_AHEAD_SHARE, auto_inflight_cap
from ..plan.splits import DEFAULT_FRACTIONS, SplitManifest, split_by_chunk
from ..stores.obstore_stores import as_store, obstore_store
from ..stores.owned import close_store
from ..stores.reading import LOCAL_ROUTE, reading_store
from .selection_args import parse_selection, select
from .store_args import URL_HELP, add_store_options, store_options

__all__ = ["add_inspect_parser", "inspect_store", "run_inspect"]

KNOB_HELP = {
    "batch_size": "samples per batch",
    "block_chunks": "chunks per shuffle block: shuffle quality and read-ahead against memory",
    "max_inflight": "stored tiles fetched and decoded at once",
    "prefetch_depth": "finished batches queued ahead of the consumer",
}


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
    latency_ms: float | None = None,
    isel: Mapping[str, Any] | None = None,
    sel: Mapping[str, Any] | None = None,
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
    latency_ms
        A link's time to first byte per GET: adds the read ceiling these
        knobs allow on it, and the ``max_inflight`` or ``block_chunks`` that
        would lift it.
    isel, sel
        Selections on field dimensions, applied to every variable and static
        field that has the dimension (as xarray's ``Dataset.isel``/``sel``):
        what is read, and what it costs, is then the selection's.

    Returns
    -------
    str
        Several lines, ready to print.

    Raises
    ------
    ValueError
        No data variables; variables whose sample-axis lengths differ; a bad
        knob or ``latency_ms``; a selection's dimension that no array has, or
        a label not in its coordinate.
    StoreReadError
        The store failed, or cannot list and has no consolidated metadata
        while ``variables`` is not given.
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
    if latency_ms is not None and not latency_ms > 0:
        raise ValueError(f"{latency_ms=} must be > 0 (milliseconds to a GET's first byte)")
    opened = not isinstance(url_or_store, Store)
    store: Store
    if isinstance(url_or_store, str) and storage_options:
        store = obstore_store(url_or_store, read_only=True, **storage_options)
    else:
        store = as_store(url_or_store)
    try:
        where = url_or_store if isinstance(url_or_store, str) else type(url_or_store).__name__
        arrays = _arrays(store, variables, sample_axis, group, isel, sel)
        return _describe(store, where, arrays, knobs, iterations, split, fractions, probe, latency_ms)
    finally:
        if opened:
            close_store(store)


def _arrays(
    store: Store,
    variables: Sequence[str] | None,
    sample_axis: int,
    group: str,
    isel: Mapping[str, Any] | None,
    sel: Mapping[str, Any] | None,
) -> tuple[dict[str, ArrayGeometry], dict[str, StaticField], dict[str, str]]:
    """The variables and static fields to describe (selected), and what a listing left out with why."""
    statics: dict[str, StaticField] = {}
    left_out: dict[str, str] = {}
    if variables is None:  # what InSituDataset(variables=None) would take, and what it would leave
        contents = scan_group(store, sample_axis=sample_axis, group=group)
        if not contents.variables:
            open_geometries(store, sample_axis=sample_axis, group=group)  # raises, naming what the group holds
        geoms, statics, left_out = dict(contents.variables), dict(contents.statics), contents.left_out()
    else:
        geoms = open_geometries(store, sample_axis=sample_axis, variables=variables, group=group)
    if isel or sel:
        picked = select({**geoms, **statics}, isel, sel)
        geoms = {p: picked[p] for p in geoms}
        statics = {p: picked[p] for p in statics}
    for path in statics:
        left_out.pop(path, None)  # listed as a static field instead
    return geoms, statics, left_out


def _describe(
    store: Store,
    where: str,
    arrays: tuple[dict[str, ArrayGeometry], dict[str, StaticField], dict[str, str]],
    knobs: dict[str, Any],
    iterations: int,
    split: str,
    fractions: Any,
    probe: bool,
    latency_ms: float | None,
) -> str:
    geoms, statics, left_out = arrays
    lengths = {p: g.n_samples for p, g in geoms.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"variables have different sample-axis lengths {lengths}; inspect them one at a time")
    first = next(iter(geoms.values()))
    manifest = split_by_chunk(first, fractions=fractions)
    plan = _plan(manifest, split, geoms, knobs, knobs["block_chunks"])
    stored = {p: _stored_nbytes(store, g) for p, g in geoms.items()} if probe else None
    ceiling = None if latency_ms is None else _ceiling(manifest, split, geoms, knobs, plan, latency_ms / 1e3)
    reads, opened = _reads(store, manifest, split, geoms, knobs, plan)
    info = describe_loader(
        geoms,
        {split: plan},
        knobs,
        split=split,
        reads={split: reads},
        open_reads=opened,
        index_budget_bytes=SHARD_INDEX_BUDGET_BYTES,
        store=where,
        stored_tile_bytes=stored,
        iterations=iterations,
        ceiling=ceiling,
        statics=statics,
        left_out=left_out,
        remote=sync_get(store) is None,
        client=_route(store),
    )
    return format_summary(info)


def _route(store: Store) -> dict[str, str]:
    """``{"client": ..., "reason": ...}``: which client reads ``store`` and why, as the store itself says."""
    reading = reading_store(store)
    route = LOCAL_ROUTE if reading.local_reader() is not None else reading.reader().route
    if reading is not store:  # an adapter made here: its reader's connections (none were opened) close with it
        reading.close()
    return {"client": route.client, "reason": route.reason}


def _reads(
    store: Store,
    manifest: SplitManifest,
    split: str,
    geoms: Mapping[str, ArrayGeometry],
    knobs: Mapping[str, Any],
    plan: EpochPlan,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``split``'s first pass sends, and the dataset as it opens, as ``InSituDataset.describe()`` states them.

    The same cost path (``_engine.reads.shard_runs.pass_reads``): a sharded
    array's shard indexes and runs of inner chunks, at the read permits the
    dataset would take. A remote dataset reads its first split's first
    block's shard indexes as it opens (``_engine.passes.warm``): they are the
    open's GETs, and that split's pass does not read them again.
    """
    readers, _ = read_sources(geoms, ())
    remote = sync_get(store) is None
    tile_bytes = max(g.tile_nbytes for g in geoms.values())
    if knobs["max_inflight"] != "auto":
        cap = int(knobs["max_inflight"])
    else:  # (``PassContext.permits``)
        cap = auto_inflight_cap(tile_bytes) if remote else AUTO_START
    held: list[tuple[str, int]] = []
    opened: dict[str, Any] = {"gets": 0, "bytes": 0, "split": None}
    sharded = {s: r for s, r in readers.items() if r.geometry.sharded_reads}
    warm = "train" if "train" in manifest.names else manifest.names[0]
    if remote and sharded:
        head = plan if warm == split else _plan(manifest, warm, geoms, knobs, knobs["block_chunks"])
        stages = {r.geometry.path: shard_stage(r.geometry) for r in sharded.values()}
        first = plan_shards(head, sharded, stages, 0, 0)
        opened = {"gets": len(first), "bytes": sum(st.index_nbytes for _, st in first), "split": warm}
        held = [(key, held_index_bytes(st)) for key, st in first] if warm == split else []
    reads = pass_reads(
        plan,
        readers,
        permit_cap=cap,
        remote=remote,
        first_batch_first=remote,
        held=held,
        budget_bytes=SHARD_INDEX_BUDGET_BYTES,
    )
    return reads, opened


def _plan(
    manifest: SplitManifest, split: str, geoms: Mapping[str, ArrayGeometry], knobs: Mapping[str, int], block_chunks: int
) -> EpochPlan:
    return plan_epoch(
        manifest, split, geoms, batch_size=knobs["batch_size"], block_chunks=block_chunks, shuffle=True, seed=0, epoch=0
    )


def _ceiling(
    manifest: SplitManifest,
    split: str,
    geoms: Mapping[str, ArrayGeometry],
    knobs: Mapping[str, int],
    plan: EpochPlan,
    latency_s: float,
) -> dict[str, Any]:
    """``read_ceiling`` of the knobs, plus ``suggest``: the knob value that lifts the bound, when one does."""
    ceiling = read_ceiling(plan, geoms, knobs["max_inflight"], latency_s)
    if ceiling["bound"] == "read-ahead":
        # the smallest block_chunks (doubling) whose read-ahead keeps max_inflight busy
        block_chunks, n_chunks = knobs["block_chunks"], len(manifest.chunks(split))
        while block_chunks < n_chunks:
            block_chunks = min(2 * block_chunks, n_chunks)
            wider = _plan(manifest, split, geoms, knobs, block_chunks)
            lifted = read_ceiling(wider, geoms, knobs["max_inflight"], latency_s)
            if lifted["bound"] == "max_inflight" or block_chunks == n_chunks:
                if lifted["samples_per_s"] > ceiling["samples_per_s"]:
                    ceiling["suggest"] = {
                        "block_chunks": block_chunks,
                        "working_set_bytes": wider.working_set_bytes,
                        "samples_per_s": lifted["samples_per_s"],
                    }
                break
        if "suggest" not in ceiling:  # the split is too short for a wider window
            ceiling["suggest"] = {"split_chunks": n_chunks, "usable_inflight": int(ceiling["in_flight"])}
    else:
        usable = int(ceiling["window_gets"] // READ_AHEAD_SHARE)
        if knobs["max_inflight"] != "auto" and usable > knobs["max_inflight"]:  # (auto rises to it by itself)
            lifted = read_ceiling(plan, geoms, usable, latency_s)
            tile_bytes = max(g.stored_chunk_nbytes for g in geoms.values())
            ceiling["suggest"] = {
                "max_inflight": usable,
                "inflight_bytes": (usable - knobs["max_inflight"]) * tile_bytes,
                "samples_per_s": lifted["samples_per_s"],
            }
    return ceiling


def add_inspect_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``inspect`` on an ``argparse`` subparsers object (``run=run_inspect``)."""
    parser = subparsers.add_parser(
        "inspect",
        help="show a store's variables, chunk and tile sizes, and an epoch's working set and read concurrency",
        description="What a store looks like to the loader, and what given knobs cost: only metadata is read "
        "(plus one size probe per variable). Knobs left out take InSituDataset's defaults.",
    )
    parser.add_argument("url", help=URL_HELP)
    for knob, default in _dataset_defaults().items():
        parser.add_argument(
            f"--{knob.replace('_', '-')}",
            type=_int_or_auto if knob == "max_inflight" else int,
            default=default,
            help=f"{KNOB_HELP[knob]} (default: {default}, InSituDataset's)",
        )
    parser.add_argument(
        "--iterations", type=int, default=1, help="passes open at once, e.g. 2 for zip(ds.train, ds.val) (default: 1)"
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=None,
        metavar="MS",
        help="a GET's time to first byte on your link: adds the read ceiling of these knobs and the "
        "max_inflight or block_chunks that lifts it (default: not shown)",
    )
    parser.add_argument(
        "--variables",
        nargs="+",
        default=None,
        help="array paths; naming them skips listing (default: every data variable)",
    )
    parser.add_argument(
        "--isel",
        action="append",
        metavar="DIM=POS",
        help="positions on a field dimension, e.g. --isel level=0,3 or --isel latitude=::-1 (repeatable; "
        "applies to every array with DIM; default: none)",
    )
    parser.add_argument(
        "--sel",
        action="append",
        metavar="DIM=LABEL",
        help="labels of a field dimension's coordinate, e.g. --sel level=500,850 or --sel latitude=60:30 "
        "(repeatable; default: none)",
    )
    parser.add_argument("--sample-axis", type=int, default=0, help="the axis samples are drawn along (default: 0)")
    parser.add_argument("--group", default="", help="group inside the store (default: root)")
    parser.add_argument("--split", default="train", help="the split whose epoch is planned (default: train)")
    add_store_options(parser)
    parser.add_argument(
        "--no-probe",
        dest="probe",
        action="store_false",
        help="do not ask for each variable's stored chunk size (one small request each)",
    )
    parser.set_defaults(run=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Run ``insitubatch inspect`` for parsed ``args``; prints the summary, returns 0."""
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
            storage_options=store_options(args),
            latency_ms=args.latency_ms,
            isel=parse_selection(args.isel, "--isel"),
            sel=parse_selection(args.sel, "--sel"),
        )
    )
    return 0
