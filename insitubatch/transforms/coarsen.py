"""``Coarsen``: block means over the inner axes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ._common import is_float_kind, with_data

if TYPE_CHECKING:
    from ..io.geometry import ArrayGeometry
    from .core import DecodedChunk


@dataclass(frozen=True)
class Coarsen:
    """Block mean over ``k``-wide blocks of inner axes (default the last two).

    Parameters
    ----------
    k
        Block width: one int for every coarsened axis, or one per axis.
    axes
        Inner axes to coarsen: ``0`` is the first axis after the sample axis,
        negatives count from the last. The sample axis cannot be coarsened.
    trim
        ``False`` (default): an axis whose length ``k`` does not divide
        raises. ``True``: the remainder at the end of such an axis is dropped.

    Notes
    -----
    Floating and complex chunks keep their dtype; integer chunks become
    float64 (a mean is not an integer). ``output_inner`` says both.
    """

    k: int | tuple[int, ...]
    axes: tuple[int, ...] = (-2, -1)
    trim: bool = False

    def __post_init__(self) -> None:
        axes = (self.axes,) if isinstance(self.axes, (int, np.integer)) else tuple(self.axes)
        if not axes or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
            raise TypeError(f"axes={self.axes!r} must be one or more ints (inner axes)")
        ks = (self.k,) * len(axes) if isinstance(self.k, (int, np.integer)) else tuple(self.k)
        if len(ks) != len(axes):
            raise ValueError(f"k={self.k!r} gives {len(ks)} block widths for {len(axes)} axes={axes}")
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in ks):
            raise ValueError(f"k={self.k!r} must be ints >= 1")
        object.__setattr__(self, "axes", tuple(int(a) for a in axes))
        object.__setattr__(self, "k", tuple(int(v) for v in ks))

    @property
    def cache_key(self) -> str:
        return f"insitubatch.Coarsen(k={self.k}, axes={self.axes}, trim={self.trim})/v1"

    def _plan(self, inner: tuple[int, ...], path: str) -> dict[int, int]:
        """``{inner axis: k}`` for ``inner``, checked."""
        plan: dict[int, int] = {}
        assert isinstance(self.k, tuple)  # __post_init__ made it one width per axis
        for axis, k in zip(self.axes, self.k):
            if not -len(inner) <= axis < len(inner):
                raise ValueError(
                    f"Coarsen axes={self.axes} names inner axis {axis}, but array {path!r} has inner shape "
                    f"{inner} ({len(inner)} inner axes; the sample axis cannot be coarsened)"
                )
            a = axis % len(inner)
            if a in plan:
                raise ValueError(f"Coarsen axes={self.axes} names inner axis {a} twice for array {path!r}")
            if inner[a] % k and not self.trim:
                raise ValueError(
                    f"Coarsen k={k} does not divide inner axis {a} of array {path!r} (length {inner[a]}, "
                    f"inner shape {inner}); choose a k that divides it or pass trim=True"
                )
            if inner[a] < k:
                raise ValueError(f"Coarsen k={k} is wider than inner axis {a} of array {path!r} (length {inner[a]})")
            plan[a] = k
        return plan

    @staticmethod
    def _out_dtype(dtype: np.dtype) -> np.dtype:
        return dtype if is_float_kind(dtype) else np.dtype(np.float64)

    def output_inner(self, geometry: ArrayGeometry) -> tuple[tuple[int, ...], np.dtype]:
        """The inner shape with each coarsened axis divided by its ``k`` (rounded down)."""
        inner = tuple(geometry.inner_shape)
        plan = self._plan(inner, geometry.path)
        shape = tuple(n // plan[a] if a in plan else n for a, n in enumerate(inner))
        return shape, self._out_dtype(np.dtype(geometry.dtype))

    def __call__(self, chunk: DecodedChunk) -> DecodedChunk:
        x = chunk.data
        path = chunk.read.array
        if x.dtype.kind not in "biufc":
            raise TypeError(f"Coarsen averages numbers; array {path!r} is {x.dtype}")
        inner = tuple(x.shape[1:])
        plan = self._plan(inner, path)
        keep = [slice(None)] + [slice(0, n - n % plan[a]) if a in plan else slice(None) for a, n in enumerate(inner)]
        x = x[tuple(keep)]
        blocked: list[int] = [x.shape[0]]
        block_axes: list[int] = []
        for a, n in enumerate(x.shape[1:]):
            if a in plan:
                blocked += [n // plan[a], plan[a]]
                block_axes.append(len(blocked) - 1)
            else:
                blocked.append(n)
        out = x.reshape(blocked).mean(axis=tuple(block_axes))
        return with_data(chunk, out.astype(self._out_dtype(chunk.data.dtype), copy=False))
