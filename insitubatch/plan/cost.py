"""What a loader configuration will cost, from metadata alone: one implementation, two faces.

:func:`describe_loader` turns geometries, epoch plans and the knobs into a
plain dict (variables, knobs, splits, the memory plan term by term, notes);
:func:`format_summary` renders that dict as the text ``insitubatch inspect``
and ``InSituDataset.print_summary()`` print. ``InSituDataset.describe()``
and :func:`insitubatch.tools.inspect_store.inspect_store` both call these, so the
numbers a user reads before training are the ones the loader plans with.
Nothing here fetches anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..io.geometry import ArrayGeometry
from ..io.statics import StaticField
from .anchors import loss_note
from .epoch import EpochPlan
from .quarantine import quarantine_note
from .sizing import READ_AHEAD_SHARE, auto_inflight_cap, auto_read_ahead, gets_per_read
from .splits import SplitManifest

__all__ = [
    "describe_loader",
    "empty_split_note",
    "format_summary",
    "read_ceiling",
]

MB = 1e6
MIB = 1 << 20
# Below this many samples per shuffle block per batch, consecutive batches
# draw from few chunks; said as a note, not an error.
MIN_BLOCK_SAMPLES_PER_BATCH = 4
# A decoded tile from this size up makes each in-flight read a visible memory
# cost (the "fat chunks" regime of docs/tuning.md); the note says how much.
FAT_TILE_BYTES = 16 * MIB
KNOBS = ("batch_size", "block_chunks", "max_inflight", "prefetch_depth")


def empty_split_note(split: str, why: str) -> str:
    """Iterating ``split`` yields nothing, and ``why`` (``EpochPlanner.empty_reason``), in one sentence."""
    return f"split {split!r} yields no sample — {why}; iterating it is an empty loop"


def read_ceiling(
    plan: EpochPlan, geometries: Mapping[str, ArrayGeometry], max_inflight: int | str, latency_s: float
) -> dict[str, Any]:
    """What a link of ``latency_s`` per GET allows this plan, from latency alone.

    GETs in flight are ``max_inflight`` or what the read-ahead window
    (``read_ahead_bound`` reads, in GETs) leaves in flight, whichever is
    smaller; each takes ``latency_s``, so the pass moves ``in_flight /
    latency_s`` GETs per second and ``samples / gets`` samples per GET.
    ``max_inflight="auto"`` is taken at its cap, with the deeper read-ahead
    it grants a remote pass. ``bound`` names the knob that sets it:
    ``"read-ahead"`` (``block_chunks``) or ``"max_inflight"``. Bandwidth,
    decode and the training step come on top, so a real pass is at best
    this fast.
    """
    if not latency_s > 0:
        raise ValueError(f"{latency_s=} must be > 0")
    tiles = {g.source: g.tiles_read for g in geometries.values()}
    gets = sum(tiles[source] for source, _ in plan.reads)
    reads = plan.read_ahead_bound
    if max_inflight == "auto":
        max_inflight = auto_inflight_cap(max(g.tile_nbytes for g in geometries.values()))
        reads += auto_read_ahead(plan, tiles, max_inflight)[1]
    window = reads * gets_per_read(plan, tiles)
    reachable = max(window / READ_AHEAD_SHARE, 1.0)
    in_flight = min(float(max_inflight), reachable)
    gets_per_s = in_flight / latency_s
    return {
        "latency_s": float(latency_s),
        "gets": int(gets),
        "samples": plan.n_samples,
        "window_gets": int(round(window)),
        "in_flight": in_flight,
        "bound": "read-ahead" if reachable < int(max_inflight) else "max_inflight",
        "gets_per_s": gets_per_s,
        "samples_per_s": gets_per_s * plan.n_samples / gets if gets else 0.0,
    }


def _split_row(plan: EpochPlan, reads: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "samples": plan.n_samples,
        "batches": plan.n_batches,
        "blocks": plan.n_blocks,
        "reads": len(plan.reads),
        "gets": int(reads["gets"]),
        "bytes": None if reads.get("bytes") is None else int(reads["bytes"]),  # known where no codec compresses
        "index_gets": int(reads["index_gets"]),
        "index_bytes": int(reads["index_bytes"]),
        "working_set_bytes": int(plan.working_set_bytes),
        "read_ahead_bound": int(plan.read_ahead_bound),
    }


def describe_loader(
    geometries: Mapping[str, ArrayGeometry],
    plans: Mapping[str, EpochPlan],
    knobs: Mapping[str, Any],
    *,
    split: str,
    reads: Mapping[str, Mapping[str, Any]],
    index_budget_bytes: int,
    store: str = "",
    iterations: int = 1,
    budget_bytes: int | None = None,
    batch_geometries: Mapping[str, ArrayGeometry] | None = None,
    stored_tile_bytes: Mapping[str, int | None] | None = None,
    ceiling: Mapping[str, Any] | None = None,
    empty: Mapping[str, str] | None = None,
    open_reads: Mapping[str, Any] | None = None,
    statics: Mapping[str, StaticField] | None = None,
    left_out: Mapping[str, str] | None = None,
    remote: bool = False,
    client: Mapping[str, str] | None = None,
    manifest: SplitManifest | None = None,
    losses: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The loader's cost for ``knobs`` as a JSON-able dict (see ``InSituDataset.describe``).

    ``geometries`` are the stored arrays by label (what a GET returns);
    ``batch_geometries`` what a batch row holds (after chunk transforms,
    default the same); ``plans`` one epoch plan per split; ``split`` the one
    the memory plan is for, ``iterations`` how many passes are open at once
    (train and val zipped is 2). ``stored_tile_bytes`` are probed encoded
    sizes, ``None`` where unknown. ``ceiling`` is a :func:`read_ceiling`
    (plus any ``suggest`` entry), reported as given. ``reads`` are, per split,
    what the engine predicts its pass sends (``_engine.reads.shard_runs.pass_reads``:
    ``gets``, ``index_gets``, ``index_bytes``, ``index_held_bytes``); ``open_reads``
    the GETs and bytes sent as the dataset opened, apart from every split's;
    ``index_budget_bytes`` the most shard index entries a split holds. ``empty`` gives, for
    each split that yields no sample although it was not asked to be
    empty, why (``EpochPlanner.empty_reason``): each is a note. ``statics`` are
    ``{label: StaticField}`` (held once, counted in the memory plan); ``left_out`` what the dataset did not take from the store, with
    why. ``knobs["max_inflight"]`` may be ``"auto"``: the in-flight terms are
    then stated at its cap, and on a ``remote`` store the read-ahead beyond
    the working set is a term too. ``client`` is which HTTP client reads the
    store, and why (``{"client": ..., "reason": ...}``, from the routing).
    ``manifest`` is the split manifest: its quarantined chunks are a note. ``losses`` are each split's
    anchors lost to its times (``EpochPlanner.losses``): ``splits[name]["lost"]`` and a note.
    """
    rows = batch_geometries if batch_geometries is not None else geometries
    tiles_per_read = {g.source: g.tiles_read for g in geometries.values()}
    variables: dict[str, dict[str, Any]] = {}
    for label, g in geometries.items():
        variables[label] = {
            "path": g.path,
            "selection": {a.name: a.text() for a in g.selection},
            "shape": list(g.shape),
            "sample_shape": list(rows[label].inner_shape),
            "dtype": str(g.dtype),
            "stored_chunk": list(g.stored_chunks),
            "tiles": g.tiles_read,
            "tiles_per_chunk": g.tiles_per_chunk,
            "samples_per_chunk": g.sample_chunk_size,
            "chunk_bytes": int(g.chunk_nbytes),
            "tile_bytes": int(g.tile_nbytes),
            "read_chunk": list(g.tile_chunks),
            "shard_reads": "inner chunks by byte range" if g.sharded_reads else None,
            "stored_tile_bytes": None if stored_tile_bytes is None else stored_tile_bytes.get(label),
        }
    splits: dict[str, dict[str, Any]] = {name: _split_row(plan, reads[name]) for name, plan in plans.items()}
    mine = splits[split]
    # a batch buffer holds at most a pass's samples (a batch_size past the split's length is one short batch)
    batch_rows = min(knobs["batch_size"], max((p.n_samples for p in plans.values()), default=0))
    batch_bytes = batch_rows * sum(g.sample_nbytes for g in rows.values())
    tile_bytes = max(g.tile_nbytes for g in geometries.values())
    auto = knobs["max_inflight"] == "auto"
    inflight_tiles = auto_inflight_cap(tile_bytes) if auto else int(knobs["max_inflight"])
    inflight_bytes = inflight_tiles * tile_bytes  # one set of permits over every pass
    ratios = [v["tile_bytes"] / v["stored_tile_bytes"] for v in variables.values() if v["stored_tile_bytes"]]
    wire = inflight_bytes / (sum(ratios) / len(ratios)) if ratios else None
    # queued + the one in assembly + the one the consumer holds (its buffer is not reused before)
    queue_bytes = iterations * (knobs["prefetch_depth"] + 2) * batch_bytes
    working = iterations * mine["working_set_bytes"]
    ahead = 0
    if auto and remote:
        ahead = iterations * auto_read_ahead(plans[split], tiles_per_read, inflight_tiles)[0]
        if budget_bytes is not None:  # granted as far as an explicit budget has room
            ahead = max(0, min(ahead, int(budget_bytes) - working))
    static_rows: dict[str, dict[str, Any]] = {
        label: {
            "path": f.path,
            "selection": {a.name: a.text() for a in f.selection},
            "shape": list(f.value_shape),
            "dtype": str(f.dtype),
            "bytes": int(f.nbytes),
        }
        for label, f in (statics or {}).items()
    }
    static_bytes = sum(r["bytes"] for r in static_rows.values())
    # a sharded array's indexes, 16 bytes per inner chunk: each split holds its shards' (at most the budget)
    sharded = {g.path: g for g in geometries.values() if g.sharded_reads}
    index_bytes = sum(int(reads[name]["index_held_bytes"]) for name in plans)
    memory = {
        "iterations": iterations,
        "working_set_bytes": working,
        "read_ahead_bytes": ahead,
        "budget_bytes": working + ahead if budget_bytes is None else int(budget_bytes),
        "budget": "auto" if budget_bytes is None else "explicit",
        "inflight_tiles": inflight_tiles,
        "inflight_auto": auto,
        "inflight_bytes": int(inflight_bytes),
        "inflight_wire_bytes": None if wire is None else int(wire),
        "batch_bytes": int(batch_bytes),
        "queue_bytes": int(queue_bytes),
        "statics_bytes": int(static_bytes),
        "shard_index_bytes": int(index_bytes),
        "shard_index_budget_bytes": int(index_budget_bytes),
        "total_bytes": int(working + ahead + inflight_bytes + queue_bytes + static_bytes + index_bytes),
    }
    first = next(iter(geometries.values()))
    spc = first.sample_chunk_size
    block_samples = knobs["block_chunks"] * spc
    notes = []
    if spc == 1:
        notes.append(
            "one sample per chunk: every GET serves one sample, so throughput is max_inflight / latency "
            "samples per second at best; "
            + (f"max_inflight='auto' raises it up to {inflight_tiles}" if auto else "raise max_inflight")
        )
    if block_samples < MIN_BLOCK_SAMPLES_PER_BATCH * knobs["batch_size"]:
        notes.append(
            f"a shuffle block holds {block_samples} samples, under {MIN_BLOCK_SAMPLES_PER_BATCH} batches: "
            "raise block_chunks for a better shuffle"
        )
    if first.tiles_read > 1:
        notes.append(
            f"chunks are split into {first.tiles_per_chunk} tiles: one sample-axis chunk costs {first.tiles_read} GETs"
        )
    for path, g in sharded.items():
        notes.append(
            f"{path!r} is sharded: its tiles are inner chunks {g.tile_chunks} of shards {g.stored_chunks}, read by "
            f"byte range after each shard's index (one GET per shard, all of them at most {index_bytes / MB:.3f} MB "
            f"held: a split holds {index_budget_bytes / MB:.3f} MB at most, reading again one it let go)"
        )
    for label, g in geometries.items():
        if g.selection:
            notes.append(
                f"{label!r} reads {g.source}: {g.tiles_read} of {g.tiles_per_chunk} tiles per chunk, "
                f"{g.chunk_nbytes / MB:.3f} of {g.sample_chunk_size * math.prod(g.field_shape) * g.itemsize / MB:.3f} "
                "MB kept per chunk"
            )
    if tile_bytes >= FAT_TILE_BYTES:
        notes.append(
            f"each in-flight read costs a whole {tile_bytes / MIB:.0f} MiB tile once decoded: "
            f"max_inflight={knobs['max_inflight']!r} holds up to {inflight_bytes / MIB:.0f} MiB"
        )
    for name, why in (empty or {}).items():
        notes.append(empty_split_note(name, why))
    for name, loss in (losses or {}).items():
        splits[name]["lost"] = dict(loss)
        notes.append(loss_note(name, loss))
    if manifest is not None and manifest.excluded_chunks:
        notes.append(quarantine_note(manifest.excluded_chunks, manifest.sample_chunk_size, manifest.n_samples))
    if budget_bytes is not None and budget_bytes < working:
        notes.append(
            f"cache_budget_bytes={budget_bytes} is below the working set of {working} bytes for "
            f"{iterations} open iteration(s): such a pass raises when it starts"
        )
    return {
        "store": store,
        "probed": stored_tile_bytes is not None,
        "variables": variables,
        "knobs": {k: knobs[k] if knobs[k] == "auto" else int(knobs[k]) for k in KNOBS},
        "split": split,
        "splits": splits,
        "open": {"gets": 0, "bytes": 0, "split": None, **(open_reads or {})},
        "memory": memory,
        "statics": static_rows,
        "left_out": dict(left_out or {}),
        "notes": notes,
        **({"ceiling": dict(ceiling)} if ceiling is not None else {}),
        **({"client": dict(client)} if client is not None else {}),
    }


def _mb(nbytes: float) -> str:
    return f"{nbytes / MB:.3f}" if nbytes < 10 * MB else f"{nbytes / MB:.1f}"


def format_summary(info: Mapping[str, Any]) -> str:
    """The text ``insitubatch inspect`` and ``print_summary()`` print for a :func:`describe_loader` dict."""
    variables = info["variables"]
    probe = info["probed"]
    lines = [f"store      {info['store']}"]
    if "client" in info:
        lines.append(f"client     {info['client']['client']}: {info['client']['reason']}")
    lines.append("")
    lines.append(
        f"{'variable':<28} {'shape':<18} {'dtype':<8} {'stored chunk':<18} {'tiles':>5} "
        f"{'samples/chunk':>13} {'chunk MB':>9} {'tile MB':>9}" + (f" {'stored tile MB':>14}" if probe else "")
    )
    for label, v in variables.items():
        row = (
            f"{label:<28} {str(tuple(v['shape'])):<18} {v['dtype']:<8} {str(tuple(v['stored_chunk'])):<18} "
            f"{v['tiles']:>5} {v['samples_per_chunk']:>13} {_mb(v['chunk_bytes']):>9} {_mb(v['tile_bytes']):>9}"
        )
        if probe:
            stored = v["stored_tile_bytes"]
            row += f" {(_mb(stored) if stored is not None else '-'):>14}"
        lines.append(row)
    knobs, split, mem = info["knobs"], info["split"], info["memory"]
    s = info["splits"][split]
    block_samples = knobs["block_chunks"] * next(iter(variables.values()))["samples_per_chunk"]
    wire = mem["inflight_wire_bytes"]
    n = mem["iterations"]
    per = f" × {n} open iterations" if n > 1 else ""
    lines += [
        "",
        "knobs      " + ", ".join(f"{k}={v}" for k, v in knobs.items()),
        f"epoch      split {split!r}: {s['samples']} samples, {s['batches']} batches, {s['blocks']} shuffle "
        f"blocks of {knobs['block_chunks']} chunks ({block_samples} samples each)",
    ]
    for name, other in info["splits"].items():
        if name != split:
            lines.append(
                f"split      {name!r}: {other['samples']} samples, {other['batches']} batches, "
                f"{other['gets']} GETs, working set {_mb(other['working_set_bytes'])} MB"
            )
    lines += [
        f"reads      {s['reads']} chunk reads = {s['gets']} GETs per epoch (each stored tile once"
        f"{'; each shard index, and adjacent inner chunks in one' if any(v['shard_reads'] for v in variables.values()) else ''}"
        "); "
        f"{s['samples'] / max(s['gets'], 1):.2f} samples per GET",
        f"working    {_mb(mem['working_set_bytes'])} MB resident at most ({s['read_ahead_bound']} chunk reads{per}) — "
        f"the pool's floor and its automatic budget",
    ]
    if (o := info.get("open", {})).get("gets"):
        lines.append(
            f"open       {o['gets']} GETs ({o['bytes']} bytes) as it opens: split {o['split']}'s first indexes"
        )
    if mem.get("read_ahead_bytes"):
        lines.append(
            f"ahead      {_mb(mem['read_ahead_bytes'])} MB more read ahead (max_inflight=auto on a remote store: "
            "the window fills while the current block is consumed)"
        )
    if n > 1:
        lines.append(
            f"iterations {n} open at once: pool budget {n} × working = {_mb(mem['working_set_bytes'])} MB, "
            f"queues {_mb(mem['queue_bytes'])} MB"
        )
    if mem["budget"] == "explicit":
        lines.append(f"budget     cache_budget_bytes = {_mb(mem['budget_bytes'])} MB")
    lines += [
        f"in flight  {'auto, up to ' if mem.get('inflight_auto') else ''}{mem['inflight_tiles']} tiles at once "
        f"≤ {_mb(mem['inflight_bytes'])} MB decoded" + (f" (~{_mb(wire)} MB on the wire)" if wire is not None else ""),
        f"queue      {knobs['prefetch_depth']} batches ahead + 1 in assembly + 1 you hold{per} = {_mb(mem['queue_bytes'])} MB "
        f"({_mb(mem['batch_bytes'])} MB per batch)",
        f"memory     ≈ {_mb(mem['total_bytes'])} MB for the loader "
        f"(working set{' + read ahead' if mem.get('read_ahead_bytes') else ''} + in flight + queue + statics), "
        "before the interpreter",
    ]
    for label, v in info.get("statics", {}).items():
        picked = "".join(f" {k}={t}" for k, t in v["selection"].items())
        lines.append(
            f"static     {label}: {v['path']}{picked} {tuple(v['shape'])} {v['dtype']}, {_mb(v['bytes'])} MB once"
        )
    for path, why in info.get("left_out", {}).items():
        lines.append(f"left out   {path}: {why}")
    ceiling = info.get("ceiling")
    if ceiling is not None:
        lines += _ceiling_lines(ceiling, knobs)
    lines += [f"hint       {h}" for h in info["notes"]]
    return "\n".join(lines)


def _ceiling_lines(c: Mapping[str, Any], knobs: Mapping[str, int]) -> list[str]:
    """The ``ceiling`` line (and the ``advice`` line it implies) for ``--latency-ms``."""
    ms = c["latency_s"] * 1e3
    if c["bound"] == "read-ahead":
        why = (
            f"the read-ahead (block_chunks={knobs['block_chunks']}: a window of {c['window_gets']} GETs) keeps "
            f"~{c['in_flight']:.0f} in flight, under max_inflight={knobs['max_inflight']}"
        )
    else:
        why = f"max_inflight={knobs['max_inflight']} GETs in flight (the read-ahead would allow {c['window_gets']})"
    lines = [
        f"ceiling    at {ms:g} ms per GET: {why} → {c['gets_per_s']:.0f} GETs/s ≈ {c['samples_per_s']:.0f} "
        "samples/s (latency alone: bandwidth, decode and your step come on top)"
    ]
    suggest = c.get("suggest")
    if suggest and "block_chunks" in suggest:
        lines.append(
            f"advice     raise block_chunks to {suggest['block_chunks']} (working set "
            f"{_mb(suggest['working_set_bytes'])} MB) to keep max_inflight={knobs['max_inflight']} busy: "
            f"≈ {suggest['samples_per_s']:.0f} samples/s; raising max_inflight alone changes nothing"
        )
    elif suggest and "split_chunks" in suggest:
        lines.append(
            f"advice     no block_chunks widens this read-ahead (the split has {suggest['split_chunks']} chunks): "
            f"max_inflight above ~{suggest['usable_inflight']} is never used here"
        )
    elif suggest and "max_inflight" in suggest:
        lines.append(
            f"advice     raise max_inflight to {suggest['max_inflight']} (what this read-ahead can keep busy; "
            f"+{_mb(suggest['inflight_bytes'])} MB decoded in flight): ≈ {suggest['samples_per_s']:.0f} samples/s; "
            "beyond it raise block_chunks too"
        )
    return lines
