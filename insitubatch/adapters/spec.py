"""What a view's items hold, known before the first batch: each label's shape and dtype, from the geometries.

A batch row of a label is its post-transform geometry's ``row_shape``
(``(steps, *inner)`` for a windowed label) of its ``dtype``; a batch
transform that changes rows says how with ``output_rows(rows) -> rows``
(one without it keeps them). Statics are in every item as they are. The
batch dimension comes from the view's plan: every batch holds
``batch_size`` rows but the last, which holds what is left.

Once a spec was handed out, the adapters check every batch against it, so a
batch transform that changes rows without declaring it fails loudly
instead of breaking a compiled step later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .._engine.passes.batch import Batch
from ..views import DatasetView

__all__ = ["Rows", "ViewSpec", "view_spec"]

# ``{label: (row shape without the batch dimension, numpy dtype)}``
Rows = dict[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True)
class ViewSpec:
    """A view's items before the first batch: batch rows and statics by label, and the batch sizes."""

    rows: Rows  # the batch labels, after batch transforms
    statics: Rows  # the statics: the same arrays in every item, no batch dimension
    batch_size: int  # rows of every batch but the last
    last_batch: int  # rows of the last batch (== batch_size when it is full, or the view is empty)

    def shapes(self, rows: int) -> Rows:
        """Every label's full shape and dtype in an item whose batch holds ``rows`` rows (statics as they are)."""
        return {**{label: ((rows, *shape), dt) for label, (shape, dt) in self.rows.items()}, **self.statics}

    def check(self, batch: Batch) -> None:
        """Raise ``ValueError`` naming the label when ``batch`` is not what this spec promised."""
        n = len(batch)
        want = {label: ((n, *shape), dt) for label, (shape, dt) in self.rows.items()}
        got = {label: (tuple(a.shape), a.dtype) for label, a in batch.arrays.items()}
        if n not in (self.batch_size, self.last_batch) or got != want:
            differ = sorted(set(want) ^ set(got)) or [k for k in want if want[k] != got[k]] or ["the batch size"]
            raise ValueError(
                f"batch {batch.index} differs from the view's spec at {differ}: the spec says "
                f"{ {k: want.get(k) for k in differ} } for {n} rows of batches of {self.batch_size}, the batch holds "
                f"{ {k: got.get(k) for k in differ} }. A batch transform that changes labels, shapes or dtypes "
                "declares it: output_rows(rows) -> rows, each {label: (row shape, dtype)}"
            )


def _declared_rows(transform: object, rows: Rows) -> Rows:
    """``rows`` after ``transform``: what its ``output_rows`` declares, or unchanged without one."""
    declare = getattr(transform, "output_rows", None)
    if declare is None:
        return rows
    out = declare(dict(rows))
    if not isinstance(out, Mapping):
        raise TypeError(f"{transform!r}.output_rows returned {type(out).__name__}, not a mapping of label to rows")
    checked: Rows = {}
    for label, entry in out.items():
        try:
            shape, dt = entry
            checked[str(label)] = (tuple(int(s) for s in shape), np.dtype(dt))
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{transform!r}.output_rows gave label {label!r} {entry!r}: each entry is (row shape, dtype)"
            ) from exc
    return checked


def view_spec(view: DatasetView) -> ViewSpec:
    """The shapes and dtypes of ``view``'s items, from its geometries, statics, batch transforms and plan.

    Raises
    ------
    TypeError
        A batch transform's ``output_rows`` does not return ``{label: (row shape, dtype)}``.
    """
    ctx = view.context
    rows: Rows = {label: (tuple(g.row_shape), np.dtype(g.dtype)) for label, g in ctx.outputs.items()}
    for t in ctx.batch_transforms:
        rows = _declared_rows(t, rows)
    statics: Rows = {label: (tuple(a.shape), a.dtype) for label, a in ctx.statics.items()}
    plan = view.plan()
    size = plan.batch_size
    last = plan.n_samples - (plan.n_batches - 1) * size if plan.n_batches else size
    return ViewSpec(rows=rows, statics=statics, batch_size=size, last_batch=last)
