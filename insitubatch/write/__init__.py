"""Parallel, chunk-aligned writes into one zarr group from many processes (see ``docs/writes.md``).

The flow: a coordinator calls :func:`create_layout` (every array at its full,
fixed extent), then :func:`plan_slots` (disjoint ranges aligned to every
indexed array's chunks and shards, minus what is already complete); a
scheduler or :func:`run_plan` hands each range to a worker, which writes it
through a :class:`SlotWriter` (validated writes under an atomic claim, with
completed coverage recorded at the end). :func:`write_status` shows claims,
stale claims, coverage and what remains.

A *slot* is a writer's range: one aligned, half-open ``[start, stop)`` of the
indexed axis that one :class:`SlotWriter` claims, writes and records as covered.

On an icechunk repository the same flow is one transaction
(:class:`IcechunkTransaction`): each slot is written in a fork of the
coordinator's session, the forks are merged, and one commit makes them a
snapshot; :func:`icechunk_fork` is a scheduler task's side of it.
"""

from __future__ import annotations

import warnings
from typing import Any

from .claims import DEFAULT_HEARTBEAT_S, DEFAULT_STALE_AFTER_S, ClaimInfo, CoverageRecord
from .icechunk import IcechunkTransaction
from .icechunk_handoff import clear_handoff, icechunk_fork
from .layout import IndexedArray, WriteLayout, create_layout, diff_layout, read_layout
from .runner import RunReport, SlotOutcome, run_plan, run_slot
from .slots import SlotPlan, SlotRange, plan_slots
from .spec import LayoutSpec, OutputArray
from .status import WriteStatus, clear_coverage, clear_stale_claims, write_status
from .tasks import assigned_ranges, task_index_from_env
from .writer import SlotWriter

__all__ = [  # sorted
    "ClaimInfo",
    "CoverageRecord",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_STALE_AFTER_S",
    "IcechunkTransaction",
    "IndexedArray",
    "LayoutSpec",
    "OutputArray",
    "RunReport",
    "SlotOutcome",
    "SlotPlan",
    "SlotRange",
    "SlotWriter",
    "WriteLayout",
    "WriteStatus",
    "assigned_ranges",
    "clear_coverage",
    "clear_handoff",
    "clear_stale_claims",
    "create_layout",
    "diff_layout",
    "icechunk_fork",
    "plan_slots",
    "read_layout",
    "run_plan",
    "run_slot",
    "task_index_from_env",
    "write_status",
]


def __getattr__(name: str) -> Any:
    # 0.1.0 called OutputArray ArraySpec, which shadowed zarr's own ArraySpec; the old name
    # still imports (with a warning) so scripts written against 0.1.0 keep running.
    if name == "ArraySpec":
        warnings.warn(
            "insitubatch.write.ArraySpec is deprecated: use insitubatch.write.OutputArray",
            DeprecationWarning,
            stacklevel=2,
        )
        return OutputArray
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
