"""Layout changes a test makes under open slot writers, and the spawned worker they are made under (no tests here)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import zarr
from write_helpers import BATCH, EXTENT, GROUP, WORKER_TIMEOUT_S, layout_spec, predictions
from zarr.abc.store import Store

from insitubatch.errors import LayoutChangedError, WriteBehindError
from insitubatch.write import LayoutSpec, SlotWriter, create_layout

# Exit status of a worker refused because the layout changed under it.
EXIT_CHANGED = 4


def respec(name: str, **changes: Any) -> LayoutSpec:
    """The tests' layout with array ``name`` changed (another coordinator's spec)."""
    spec = layout_spec()
    return LayoutSpec(tuple(replace(a, **changes) if a.name == name else a for a in spec.arrays))


def recreate(store: Store, name: str, **changes: Any) -> None:
    """Re-create array ``name`` as zarr does it for anyone (``overwrite=True``: its chunks are dropped)."""
    array = next(a for a in respec(name, **changes).arrays if a.name == name)
    zarr.open_group(store, path=GROUP).create_array(name, overwrite=True, **array.create_kwargs())


def restore(store: Store, name: str) -> None:
    """The coordinator's fix after a re-creation: delete the changed array, ``create_layout`` with the run's spec."""
    del zarr.open_group(store, path=GROUP)[name]
    create_layout(store, layout_spec(), group=GROUP)


def resize_pred(store: Store, extent: int) -> None:
    """Change the extent of ``pred`` in place (zarr keeps the chunks inside both extents)."""
    zarr.open_array(store, path=f"{GROUP}/pred").resize((extent, 3, 8))


# The changes a test makes mid-slot, and the coordinator's fix for each.
CHANGES = {
    "rechunk": (lambda store: recreate(store, "count", chunks=(8,)), lambda store: restore(store, "count")),
    "resize": (lambda store: resize_pred(store, EXTENT + 6), lambda store: resize_pred(store, EXTENT)),
}


def write_span(writer: SlotWriter, lo: int, hi: int) -> None:
    """Write ``[lo, hi)`` of every indexed array in ``BATCH``-sized pieces."""
    for a in range(lo, hi, BATCH):
        for name, values in predictions(a, min(a + BATCH, hi)).items():
            writer.write(name, (a, min(a + BATCH, hi)), values)


def paused_worker(store: Store, start: int, stop: int, depth: int, opened: Any, go: Any, report: str) -> None:
    """Write the slot's first batch, wait while the parent changes the layout, then try the rest.

    Exits 0 when the slot was recorded complete; ``EXIT_CHANGED`` after writing
    the refusal's type and the ``LayoutChangedError`` message to ``report``.
    """
    writer = SlotWriter(store, start, stop, group=GROUP, write_behind=depth)
    writer.open()
    write_span(writer, start, start + BATCH)
    writer.flush()  # the first batch landed: the slot is half written
    opened.wait(WORKER_TIMEOUT_S)
    go.wait(WORKER_TIMEOUT_S)
    try:
        write_span(writer, start + BATCH, stop)
        writer.complete()
    except (LayoutChangedError, WriteBehindError) as exc:
        changed = exc.__cause__ if isinstance(exc, WriteBehindError) else exc
        Path(report).write_text(f"{type(exc).__name__}:{type(changed).__name__}\n{changed}")
        writer.close()
        sys.exit(EXIT_CHANGED)
