"""``Batch``: what a pass yields (arrays per label, anchors, offsets, coords); buffers come from ``buffers``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Batch"]


@dataclass
class Batch:
    """One batch: ``arrays[label]`` is ``(len(batch), *inner)`` for every label.

    ``sample_indices`` are the anchors on the manifest's grid; label ``L``
    read ``sample_indices + offsets[L]`` along its sample axis, and a
    windowed label (``windows[L]`` its steps) ``sample_indices + offsets[L] +
    step`` for each step, as ``(batch, steps, *inner)``. ``coords`` holds
    the anchors' sample-axis coordinate (by dimension name, decoded: time as
    ``datetime64``; ``"sample"`` indices when the store has none) and, for
    each shifted or windowed label, its valid coordinates under
    ``"<label>.<dim>"``: ``(batch,)``, or ``(batch, steps)``. ``statics``
    are the dataset's static fields: the same read-only arrays in every batch.
    A label offset in time on an axis with gaps reads each anchor's own
    indices (``rows[L]``, what ``read_indices`` returns); its ``offsets``
    and ``windows`` are then the nominal steps.
    """

    arrays: dict[str, np.ndarray]
    sample_indices: np.ndarray
    offsets: dict[str, int]
    coords: Mapping[str, np.ndarray] | None = None
    epoch: int = 0
    index: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    windows: dict[str, tuple[int, ...]] = field(default_factory=dict)
    statics: Mapping[str, np.ndarray] = field(default_factory=dict)
    # labels offset in time on an irregular axis: the indices each read, per anchor (offsets are then nominal)
    rows: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sample_indices)

    @property
    def padded(self) -> np.ndarray:
        """``(batch,)`` bool: ``True`` for rows that repeat a sample to fill the batch (``last_batch="pad"``)."""
        mask = self.extras.get("padded")
        return np.zeros(len(self), dtype=bool) if mask is None else mask

    def read_indices(self, label: str) -> np.ndarray:
        """The sample-axis indices ``label`` was read at: ``(batch,)``, or ``(batch, steps)`` for a windowed label."""
        if label not in self.offsets:
            raise KeyError(f"label {label!r} is not in this batch; labels are {sorted(self.offsets)}")
        if label in self.rows:
            return self.rows[label]
        steps = self.windows.get(label)
        if steps:
            return self.sample_indices[:, None] + self.offsets[label] + np.asarray(steps)[None, :]
        return self.sample_indices + self.offsets[label]

    def stack(self, labels: Sequence[str], axis: int = 1) -> np.ndarray:
        """Stack several labels' arrays along a new ``axis`` (e.g. channels)."""
        missing = [lb for lb in labels if lb not in self.arrays]
        if missing:
            raise KeyError(f"labels {missing} are not in this batch; labels are {sorted(self.arrays)}")
        return np.stack([self.arrays[lb] for lb in labels], axis=axis)
