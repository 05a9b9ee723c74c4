"""Slot plans: disjoint, chunk- and shard-aligned index ranges, one per worker task.

:func:`plan_slots` cuts what is left to write of a group's indexed extent into
half-open ranges whose boundaries fall on multiples of the layout's alignment
(the LCM of every indexed array's chunk and shard length), so no two ranges
touch the same stored object. The plan serialises to JSON with the
environment a scheduler hands each task; a task finds its range(s) from its
scheduler's index variable (``write.tasks``). When the layout stores the index
axis's coordinate, every range also carries the coordinate of its first and
last index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zarr.abc.store import Store

from ..errors import SlotAlignmentError, SlotPlanBlockedError
from ._intervals import Interval, merge, overlaps, subtract
from .coords import IndexCoordinate
from .layout import WriteLayout, read_layout
from .status import write_status

__all__ = [
    "ENV_PLAN",
    "ENV_SLOT_GROUP",
    "ENV_SLOT_START",
    "ENV_SLOT_STOP",
    "ENV_STORE",
    "TASK_INDEX_VARIABLES",
    "SlotPlan",
    "SlotRange",
    "plan_slots",
]

# Environment a scheduler passes to one worker task.
ENV_SLOT_START = "INSITUBATCH_SLOT_START"
ENV_SLOT_STOP = "INSITUBATCH_SLOT_STOP"
ENV_SLOT_GROUP = "INSITUBATCH_SLOT_GROUP"
ENV_STORE = "INSITUBATCH_STORE"
# Path of a saved plan, for tasks that find their range by index.
ENV_PLAN = "INSITUBATCH_SLOT_PLAN"
# Scheduler task-index variables, in the order they are consulted, each with the
# variable holding the task count (None when the scheduler does not export one).
TASK_INDEX_VARIABLES: tuple[tuple[str, str | None], ...] = (
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"),  # SLURM job arrays
    ("JOB_COMPLETION_INDEX", None),  # Kubernetes indexed Jobs
    ("RANK", "WORLD_SIZE"),  # torchrun / torch.distributed
)
# Version of the plan's JSON schema.
PLAN_VERSION = 1


@dataclass(frozen=True, order=True)
class SlotRange:
    """A half-open index range ``[start, stop)`` one worker owns.

    ``first``/``last`` are the index coordinate at its first and last index
    (as text), when the layout stores one.
    """

    start: int
    stop: int
    first: str | None = field(default=None, compare=False)
    last: str | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        """Number of indices in the range."""
        return self.stop - self.start

    def env(self, group: str = "", store_url: str | None = None) -> dict[str, str]:
        """The environment variables that hand this range to a worker."""
        env = {ENV_SLOT_START: str(self.start), ENV_SLOT_STOP: str(self.stop), ENV_SLOT_GROUP: group}
        if store_url is not None:
            env[ENV_STORE] = store_url
        return env


def _ranges(pairs: Any, coord: IndexCoordinate | None = None) -> tuple[SlotRange, ...]:
    """Ranges from ``(start, stop)`` pairs, labelled by ``coord`` when given."""
    spans = [(int(a), int(b)) for a, b in pairs]
    return tuple(SlotRange(a, b, *(coord.span(a, b) if coord is not None else (None, None))) for a, b in spans)


@dataclass(frozen=True)
class SlotPlan:
    """What is left to write of a group, cut into aligned ranges for worker tasks.

    Attributes
    ----------
    group
        Path of the output group.
    extent
        Length of the indexed dimension.
    alignment
        LCM of every indexed array's chunk and shard length on the indexed axis.
    slot_size
        Length of the longest range (a range ending at a gap or the array end
        may be shorter).
    ranges
        The ranges to write, in index order; task ``i`` writes ``ranges[i]``.
    indexed
        Indexed array name → index axis.
    completed
        Ranges recorded complete (excluded).
    in_progress
        Ranges held by live claims (excluded; they are being written).
    stale
        Ranges held by stale claims (planned; clear the claims before writing).
    store_url
        The store's URL when the plan was made from one (the CLI), else ``None``.
    """

    group: str
    extent: int
    alignment: int
    slot_size: int
    ranges: tuple[SlotRange, ...]
    indexed: Mapping[str, int] = field(default_factory=dict)
    completed: tuple[SlotRange, ...] = ()
    in_progress: tuple[SlotRange, ...] = ()
    stale: tuple[SlotRange, ...] = ()
    store_url: str | None = None

    def __len__(self) -> int:
        return len(self.ranges)

    def ranges_for_task(self, index: int, count: int | None = None) -> tuple[SlotRange, ...]:
        """The ranges task ``index`` of ``count`` writes.

        With ``count`` ``None`` or equal to the number of ranges, task ``i``
        writes ``ranges[i]``; with fewer tasks than ranges, task ``i`` writes
        ``ranges[i::count]``; with more, tasks past the last range get none.

        Raises
        ------
        IndexError
            ``index`` is negative, or past the ranges when ``count`` is ``None``.
        """
        if index < 0 or (count is not None and index >= count):
            raise IndexError(f"task {index=} must satisfy 0 <= index < count={count}")
        if count is None or count == len(self.ranges):
            if index >= len(self.ranges):
                raise IndexError(
                    f"task {index=} has no range: the plan has {len(self.ranges)} "
                    f"(submit tasks 0..{len(self.ranges) - 1}, e.g. sbatch --array=0-{len(self.ranges) - 1})"
                )
            return (self.ranges[index],)
        return self.ranges[index::count]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; each range carries the env a scheduler passes its task."""
        n = len(self.ranges)
        return {
            "version": PLAN_VERSION,
            "group": self.group,
            "store": self.store_url,
            "extent": self.extent,
            "alignment": self.alignment,
            "slot_size": self.slot_size,
            "indexed": dict(self.indexed),
            "tasks": n,
            "task_index_variables": [name for name, _ in TASK_INDEX_VARIABLES],
            "slurm_array": f"0-{n - 1}" if n else None,
            "ranges": [
                {"task": i, "start": r.start, "stop": r.stop, **_labels(r), "env": r.env(self.group, self.store_url)}
                for i, r in enumerate(self.ranges)
            ],
            "completed": [[r.start, r.stop] for r in self.completed],
            "in_progress": [[r.start, r.stop] for r in self.in_progress],
            "stale": [[r.start, r.stop] for r in self.stale],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The plan as JSON text (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlotPlan:
        """Rebuild a plan from :meth:`to_dict` output."""
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"plan version={data.get('version')!r} is not {PLAN_VERSION}")
        return cls(
            group=data["group"],
            extent=int(data["extent"]),
            alignment=int(data["alignment"]),
            slot_size=int(data["slot_size"]),
            ranges=tuple(
                SlotRange(int(r["start"]), int(r["stop"]), r.get("first"), r.get("last")) for r in data["ranges"]
            ),
            indexed={k: int(v) for k, v in data.get("indexed", {}).items()},
            completed=_ranges(data.get("completed", ())),
            in_progress=_ranges(data.get("in_progress", ())),
            stale=_ranges(data.get("stale", ())),
            store_url=data.get("store"),
        )

    @classmethod
    def from_json(cls, text: str) -> SlotPlan:
        """Rebuild a plan from :meth:`to_json` text."""
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON to ``path``."""
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SlotPlan:
        """Read a plan saved by :meth:`save`."""
        return cls.from_json(Path(path).read_text())


def _labels(r: SlotRange) -> dict[str, str]:
    return {} if r.first is None else {"first": r.first, "last": str(r.last)}


def _by_size(gaps: list[Interval], step: int) -> list[Interval]:
    """Cut each gap into ranges of ``step`` indices (the last of a gap may be short)."""
    return [(s, min(s + step, hi)) for lo, hi in gaps for s in range(lo, hi, step)]


def _by_workers(gaps: list[Interval], alignment: int, workers: int) -> list[Interval]:
    """Share the gaps' alignment units among ``workers`` runs of near-equal count (±1 unit).

    A run that spans a completed hole becomes two ranges, so holes can add ranges.
    """
    counts = [-(-(hi - lo) // alignment) for lo, hi in gaps]
    total = sum(counts)
    if total == 0:
        return []
    runs = min(workers, total)
    base, extra = divmod(total, runs)
    cuts = [k * base + min(k, extra) for k in range(1, runs)]  # unit index where run k starts
    ranges: list[Interval] = []
    offset = 0
    for (lo, hi), count in zip(gaps, counts):
        inner = [lo + (c - offset) * alignment for c in cuts if offset < c < offset + count]
        edges = [lo, *inner, hi]
        ranges.extend(zip(edges[:-1], edges[1:]))
        offset += count
    return ranges


def plan_slots(
    store: Store,
    *,
    group: str = "",
    slot_size: int | None = None,
    workers: int | None = None,
    resume: bool = True,
    store_url: str | None = None,
) -> SlotPlan:
    """Plan aligned, disjoint slot ranges over what is left to write of ``group``.

    Parameters
    ----------
    store
        The zarr store holding a group made by :func:`create_layout`.
    group
        Path of the output group.
    slot_size
        Length of each range; a multiple of the layout's alignment. Mutually
        exclusive with ``workers``. With neither, each range is one alignment
        unit (one shard, or one chunk when unsharded, of the coarsest array).
    workers
        Number of ranges to aim for: the remaining alignment units are shared
        out in ``workers`` runs whose unit counts differ by at most one (a run
        spanning a completed hole becomes two ranges; fewer units than
        workers give one range per unit).
    resume
        Exclude ranges recorded complete and ranges held by live claims.
        ``False`` plans the whole extent (writers still refuse completed
        ranges unless forced).
    store_url
        Recorded in the plan (and in each task's env) so tasks can open the store.

    Returns
    -------
    SlotPlan

    Raises
    ------
    SlotAlignmentError
        ``slot_size`` is not a positive multiple of the alignment (the message
        names the LCM and the arrays behind it).
    SlotPlanBlockedError
        A remaining gap does not start and end on aligned boundaries (its
        neighbours were written with other boundaries); the message says how
        to clear it.
    LayoutMismatchError
        The group has no write layout.
    ValueError
        Both ``slot_size`` and ``workers`` given, or ``workers < 1``.
    """
    group = group.strip("/")
    layout = read_layout(store, group)
    alignment = layout.alignment
    if slot_size is not None and workers is not None:
        raise ValueError(f"give slot_size={slot_size} or workers={workers}, not both")
    if workers is not None and workers < 1:
        raise ValueError(f"{workers=} must be >= 1")
    if slot_size is not None and (slot_size < 1 or slot_size % alignment):
        raise SlotAlignmentError(
            f"{slot_size=} must be a positive multiple of {alignment}, the LCM of every indexed "
            f"array's chunk and shard length ({_explain(layout)}); e.g. "
            f"slot_size={max(1, round(slot_size / alignment)) * alignment}"
        )

    completed: list[Interval] = []
    busy: list[Interval] = []
    stale: list[Interval] = []
    if resume:
        status = write_status(store, group)
        completed = list(status.completed)
        busy = merge((c.start, c.stop) for c in status.live_claims)
        stale = merge((c.start, c.stop) for c in status.stale_claims)
    gaps, blocked = _aligned_parts(layout, subtract((0, layout.extent), completed + busy))
    if blocked:
        raise _blocked(layout, blocked, completed, busy)
    if workers is not None:
        ranges = _by_workers(gaps, alignment, workers)
        size = max((b - a for a, b in ranges), default=alignment)
    else:
        size = alignment if slot_size is None else slot_size
        ranges = _by_size(gaps, size)
    return SlotPlan(
        group=group,
        extent=layout.extent,
        alignment=alignment,
        slot_size=size,
        ranges=_ranges(ranges, layout.coord),
        indexed={a.name: a.axis for a in layout.arrays},
        completed=_ranges(completed, layout.coord),
        in_progress=_ranges(busy, layout.coord),
        stale=_ranges((r for r in stale if any(overlaps(r, g) for g in ranges)), layout.coord),
        store_url=store_url,
    )


def _aligned_parts(layout: WriteLayout, gaps: list[Interval]) -> tuple[list[Interval], list[Interval]]:
    """Split each gap into its aligned middle and the unaligned ends (blocked)."""
    a, aligned, blocked = layout.alignment, [], []
    for lo, hi in gaps:
        first = min(-(-lo // a) * a, layout.extent)  # first boundary at or after lo
        last = hi if layout.is_boundary(hi) else hi // a * a  # last boundary at or before hi
        if first >= last:
            blocked.append((lo, hi))
            continue
        if first > lo:
            blocked.append((lo, first))
        aligned.append((first, last))
        if last < hi:
            blocked.append((last, hi))
    return aligned, blocked


def _explain(layout: WriteLayout) -> str:
    return ", ".join(
        f"{a.name}: chunk {a.chunk}" + (f", shard {a.shard}" if a.shard is not None else "") for a in layout.arrays
    )


def _blocked(
    layout: WriteLayout, blocked: list[Interval], completed: list[Interval], busy: list[Interval]
) -> SlotPlanBlockedError:
    lines = []
    for start, stop in blocked:
        lo, hi = layout.aligned_cover(start, stop)
        near = [r for r in completed + busy if overlaps(r, (lo, hi))]
        lines.append(
            f"[{start}, {stop}) lies inside the aligned range [{lo}, {hi}), which also holds "
            f"completed or claimed ranges {near}: clear_coverage(store, {lo}, {hi}) or "
            f"--clear-coverage {lo}:{hi}"
        )
    body = "\n  ".join(lines)
    return SlotPlanBlockedError(
        f"cannot plan: {len(blocked)} unwritten gap(s) are not aligned to {layout.alignment} "
        f"({_explain(layout)}), so writing them would share stored objects with finished work:\n  {body}\n"
        "Clear the coverage of each aligned range so it is planned and rewritten whole "
        "(insitubatch.write.clear_coverage(store, LO, HI, group=...) or "
        "`insitubatch write-status URL --group G --clear-coverage LO:HI`); a claim in the way "
        "must finish first, or be cleared once stale (`--clear-stale`).",
        tuple(blocked),
    )
