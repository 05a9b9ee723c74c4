"""What one fork of an icechunk transaction changed, and what it would clash with if merged.

icechunk merges forks without looking: of two forks that wrote the same
chunk, the one merged last wins in silence. Slot writers never do that (their
slots are disjoint and aligned to every chunk and shard), so a clash means two
workers wrote one slot (a task run twice), or work wrote outside the slot
writer. :class:`MergeLedger` remembers what each merged fork changed and
names every clash before the next fork is merged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .records import RECORDS_DIR

__all__ = ["ForkChanges", "MergeLedger", "rebase_conflicts"]

# Chunk coordinates quoted per array in a message: enough to find them, never a whole array's worth.
_QUOTED_CHUNKS = 5
# The record containers every slot writer's fork creates alike (identical documents): shared, never a clash.
_CONTAINER = re.compile(rf"(^|/){re.escape(RECORDS_DIR)}(/(claims|coverage))?$")
# A coverage record: the slot [start, stop) recorded complete.
_COVERAGE = re.compile(rf"(^|/){re.escape(RECORDS_DIR)}/coverage/(\d+)-(\d+)$")


def _path(node: str) -> str:
    return node.strip("/")


@dataclass(frozen=True)
class ForkChanges:
    """The chunks, nodes and completed slots of one fork (from its session's ``status()``)."""

    chunks: Mapping[str, frozenset[tuple[int, ...]]]
    nodes: frozenset[str]
    slots: tuple[tuple[int, int], ...]
    label: str = field(default="", compare=False)

    @classmethod
    def of(cls, diff: Any, label: str | None = None) -> ForkChanges:
        """Read an icechunk ``Diff``; ``label`` names the fork in messages (default: by its slots)."""
        chunks = {
            _path(p): frozenset(tuple(int(i) for i in c) for c in coords) for p, coords in diff.updated_chunks.items()
        }
        nodes: set[str] = set()
        for kind in (
            "new_groups",
            "new_arrays",
            "updated_groups",
            "updated_arrays",
            "deleted_groups",
            "deleted_arrays",
        ):
            nodes.update(_path(p) for p in getattr(diff, kind))
        slots = []
        for node in nodes:
            m = _COVERAGE.search(node)
            if m is not None:
                slots.append((int(m.group(2)), int(m.group(3))))
        shared = {n for n in nodes if _CONTAINER.search(n)}
        slots.sort()
        if label is None:
            shown = ", ".join(f"[{a}, {b})" for a, b in slots)
            label = (
                f"the fork of slot{'s' if len(slots) > 1 else ''} {shown}" if slots else "a fork that recorded no slot"
            )
        return cls({p: c for p, c in chunks.items() if c}, frozenset(nodes - shared), tuple(slots), label)

    @property
    def empty(self) -> bool:
        """Whether the fork changed nothing (record containers aside)."""
        return not self.chunks and not self.nodes


class MergeLedger:
    """Every chunk and node the forks merged so far changed, by the fork that changed it."""

    def __init__(self) -> None:
        self._chunks: dict[str, dict[tuple[int, ...], str]] = {}
        self._nodes: dict[str, str] = {}
        self.slots: list[tuple[int, int]] = []

    def conflicts(self, changes: ForkChanges) -> tuple[str, ...]:
        """One line per clash of ``changes`` with what is merged (empty: it merges cleanly)."""
        lines = []
        for path, coords in sorted(changes.chunks.items()):
            held = self._chunks.get(path, {})
            by_other: dict[str, list[tuple[int, ...]]] = {}
            for c in sorted(coords):
                if c in held:
                    by_other.setdefault(held[c], []).append(c)
            for other, clash in by_other.items():
                lines.append(f"array {path!r}: {_chunks_text(clash)} written by both {changes.label} and {other}")
        for node in sorted(changes.nodes):
            holder = self._nodes.get(node)
            if holder is None:
                continue
            m = _COVERAGE.search(node)
            if m is not None:
                what = f"slot [{int(m.group(2))}, {int(m.group(3))}) recorded complete"
            else:
                what = f"node {node!r} created, changed or deleted"
            lines.append(f"{what} by both {changes.label} and {holder}")
        return tuple(lines)

    def add(self, changes: ForkChanges) -> None:
        """Remember ``changes`` as merged."""
        for path, coords in changes.chunks.items():
            held = self._chunks.setdefault(path, {})
            for c in coords:
                held[c] = changes.label
        for node in changes.nodes:
            self._nodes[node] = changes.label
        self.slots.extend(changes.slots)
        self.slots.sort()


def _chunks_text(coords: list[tuple[int, ...]]) -> str:
    shown = ", ".join(str(c) for c in coords[:_QUOTED_CHUNKS])
    more = f" and {len(coords) - _QUOTED_CHUNKS} more" if len(coords) > _QUOTED_CHUNKS else ""
    return f"chunk{'s' if len(coords) > 1 else ''} {shown}{more}"


def rebase_conflicts(conflicts: Iterable[Any]) -> tuple[str, ...]:
    """One line per conflict icechunk found rebasing a commit onto a branch that moved."""
    lines = []
    for c in conflicts:
        chunks = [tuple(int(i) for i in coords) for coords in (getattr(c, "conflicted_chunks", None) or ())]
        where = f": {_chunks_text(chunks)}" if chunks else ""
        lines.append(f"{c.conflict_type} at {_path(str(c.path))!r}{where}")
    return tuple(lines)
