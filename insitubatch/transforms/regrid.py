"""``Regrid``: bilinear interpolation of a chunk onto a target lat/lon grid."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ._common import digest, is_derived, readonly, with_data

if TYPE_CHECKING:
    from ..io.geometry import ArrayGeometry
    from .core import DecodedChunk

# A regrid target this close to the edge of the source grid, as a fraction of
# one source spacing, is on the edge (float round-off), not outside it.
EDGE_TOLERANCE = 1e-6
# What Regrid does with a target outside the source grid.
OUT_OF_RANGE_POLICIES = ("raise", "clamp")
# Longitude period, in degrees, for Regrid(periodic_lon=True).
FULL_CIRCLE_DEGREES = 360.0


def _coordinate(value: Any, name: str) -> np.ndarray:
    a = np.array(value, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of coordinates, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite coordinates")
    return readonly(a)


def _axis_weights(
    src: np.ndarray, dst: np.ndarray, *, name: str, out_of_range: str, period: float | None, hint: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per target on one axis: lower and upper source index, and the upper's weight.

    ``src`` may ascend or descend. With ``period`` the axis is a circle, so
    every target lies between two source points. A target with all its
    weight on one source point uses that point for both neighbours, so a NaN
    in a neighbour it does not use cannot leak in through a zero weight.
    """
    n = src.size
    if n == 1:
        offset = np.abs(dst - src[0])
        outside = offset > 0
        if outside.any() and out_of_range == "raise":
            raise ValueError(
                f"{int(outside.sum())} target {name} value(s) differ from the only source {name} "
                f"{float(src[0])!r} (e.g. {float(dst[outside][0])!r}); pass out_of_range='clamp' to use it anyway"
            )
        zeros = np.zeros(dst.size, dtype=np.intp)
        return zeros, zeros.copy(), np.zeros(dst.size)
    steps = np.diff(src)
    if not (np.all(steps > 0) or np.all(steps < 0)):
        raise ValueError(f"source {name} coordinates must be strictly increasing or strictly decreasing")
    descending = bool(steps[0] < 0)
    ascending = src[::-1] if descending else src
    to_src = np.arange(n)
    x = dst
    if period is not None:
        if ascending[-1] - ascending[0] >= period:
            span = float(ascending[-1] - ascending[0])
            raise ValueError(f"source {name} spans {span!r}, not less than one period ({period})")
        x = ascending[0] + np.mod(dst - ascending[0], period)
        ascending = np.append(ascending, ascending[0] + period)
        to_src = np.append(to_src, 0)  # the wrap-around point is the first source point again
    lower = np.clip(np.searchsorted(ascending, x, side="right") - 1, 0, ascending.size - 2)
    w = (x - ascending[lower]) / (ascending[lower + 1] - ascending[lower])
    outside = (w < -EDGE_TOLERANCE) | (w > 1 + EDGE_TOLERANCE)
    if outside.any() and out_of_range == "raise":
        raise ValueError(
            f"{int(outside.sum())} target {name} value(s) lie outside the source range "
            f"[{float(ascending[0])!r}, {float(ascending[-1])!r}] (e.g. {float(dst[outside][0])!r}); "
            f"pass out_of_range='clamp' to take the nearest edge value{hint}"
        )
    w = np.clip(w, 0.0, 1.0)
    i0, i1 = to_src[lower], to_src[lower + 1]
    if descending:
        i0, i1 = n - 1 - i0, n - 1 - i1
    i1 = np.where(w == 0, i0, i1)
    i0 = np.where(w == 1, i1, i0)
    return i0.astype(np.intp), i1.astype(np.intp), w


@dataclass(frozen=True, eq=False)
class Regrid:
    """Bilinear interpolation of the last two inner axes from one lat/lon grid to another.

    The weights are computed once, at construction: for every target point
    the flat indices of its four source neighbours and their four weights.
    Each chunk is then four ``np.take`` gathers and a weighted sum over all
    target points at once.

    Parameters
    ----------
    src_lat, src_lon
        Source coordinates of the last two inner axes (latitude, then
        longitude), 1-D, strictly monotonic; descending latitudes are fine.
    dst_lat, dst_lon
        Target coordinates, 1-D, in any order.
    out_of_range
        ``"raise"`` (default): a target outside the source grid raises here,
        at construction. ``"clamp"``: it takes the value at the nearest edge
        (constant extrapolation).
    periodic_lon
        Treat longitude as a circle (period 360): a target between the last
        and the first source longitude interpolates across the seam, and
        targets may use any longitude convention (-180..180 or 0..360).
    cache_key
        Identity in a persistent cache; ``None`` derives one from the
        coordinates and options (a derived key passed back in is re-derived).

    Notes
    -----
    Floating and complex chunks are interpolated in their own dtype; integer
    chunks in float64 and rounded back. ``output_inner`` keeps the dtype and
    replaces the last two inner axes by ``(len(dst_lat), len(dst_lon))``.
    """

    src_lat: Any
    src_lon: Any
    dst_lat: Any
    dst_lon: Any
    out_of_range: str = "raise"
    periodic_lon: bool = False
    cache_key: str | None = None
    _index: np.ndarray = field(init=False, repr=False)
    _weights: np.ndarray = field(init=False, repr=False)
    _typed_weights: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.out_of_range not in OUT_OF_RANGE_POLICIES:
            raise ValueError(f"out_of_range={self.out_of_range!r} must be one of {OUT_OF_RANGE_POLICIES}")
        coords = {name: _coordinate(getattr(self, name), name) for name in ("src_lat", "src_lon", "dst_lat", "dst_lon")}
        for name, a in coords.items():
            object.__setattr__(self, name, a)
        lat0, lat1, wlat = _axis_weights(
            coords["src_lat"], coords["dst_lat"], name="lat", out_of_range=self.out_of_range, period=None
        )
        lon0, lon1, wlon = _axis_weights(
            coords["src_lon"],
            coords["dst_lon"],
            name="lon",
            out_of_range=self.out_of_range,
            period=FULL_CIRCLE_DEGREES if self.periodic_lon else None,
            hint="" if self.periodic_lon else ", or periodic_lon=True for a global grid",
        )
        n_lon = coords["src_lon"].size
        corners = [(lat0, lon0, (1 - wlat), (1 - wlon)), (lat0, lon1, (1 - wlat), wlon),
                   (lat1, lon0, wlat, (1 - wlon)), (lat1, lon1, wlat, wlon)]  # fmt: skip
        index = np.stack([(la[:, None] * n_lon + lo[None, :]).reshape(-1) for la, lo, _, _ in corners])
        weights = np.stack([(wa[:, None] * wo[None, :]).reshape(-1) for _, _, wa, wo in corners])
        object.__setattr__(self, "_index", readonly(index.astype(np.intp)))
        object.__setattr__(self, "_weights", readonly(weights))
        if is_derived(self.cache_key, "Regrid"):
            params = {"out_of_range": self.out_of_range, "periodic_lon": bool(self.periodic_lon)}
            key = digest("Regrid", params, coords.values())
            object.__setattr__(self, "cache_key", key)

    def __repr__(self) -> str:
        return (
            f"Regrid(src=({self.src_lat.size}, {self.src_lon.size}), dst=({self.dst_lat.size}, {self.dst_lon.size}), "
            f"out_of_range={self.out_of_range!r}, periodic_lon={self.periodic_lon!r}, cache_key={self.cache_key!r})"
        )

    @property
    def src_shape(self) -> tuple[int, int]:
        return (self.src_lat.size, self.src_lon.size)

    @property
    def dst_shape(self) -> tuple[int, int]:
        return (self.dst_lat.size, self.dst_lon.size)

    @property
    def index(self) -> np.ndarray:
        """``(4, n_targets)`` flat source indices of each target's neighbours (read-only)."""
        return self._index

    @property
    def weights(self) -> np.ndarray:
        """``(4, n_targets)`` bilinear weights matching ``index``; each column sums to 1 (read-only)."""
        return self._weights

    def _check_inner(self, inner: tuple[int, ...], path: str) -> None:
        if len(inner) < 2 or tuple(inner[-2:]) != self.src_shape:
            raise ValueError(
                f"Regrid expects array {path!r} to end in the source grid {self.src_shape} (lat, lon), "
                f"but its inner shape is {tuple(inner)}"
            )

    def output_inner(self, geometry: ArrayGeometry) -> tuple[tuple[int, ...], np.dtype]:
        """The inner shape with its last two axes replaced by the target grid; dtype unchanged."""
        inner = tuple(geometry.inner_shape)
        self._check_inner(inner, geometry.path)
        return (*inner[:-2], *self.dst_shape), np.dtype(geometry.dtype)

    def _weights_in(self, dtype: np.dtype) -> np.ndarray:
        w = self._typed_weights.get(dtype.str)
        if w is None:
            w = self._typed_weights[dtype.str] = readonly(self._weights.astype(dtype))
        return w

    def __call__(self, chunk: DecodedChunk) -> DecodedChunk:
        x = chunk.data
        path = chunk.read.array
        self._check_inner(tuple(x.shape[1:]), path)
        dtype = x.dtype
        if dtype.kind in "fc":
            compute = dtype
        elif dtype.kind in "iu":
            compute = np.dtype(np.float64)
        else:
            raise TypeError(f"Regrid interpolates numbers; array {path!r} is {dtype}")
        flat = x.reshape(-1, x.shape[-2] * x.shape[-1]).astype(compute, copy=False)
        w = self._weights_in(compute)
        out = np.take(flat, self._index[0], axis=1, mode="clip")
        out *= w[0]
        term = np.empty_like(out)
        for corner in range(1, len(self._index)):  # the other three neighbours
            np.take(flat, self._index[corner], axis=1, out=term, mode="clip")
            term *= w[corner]
            out += term
        if compute != dtype:
            out = np.rint(out, out=out).astype(dtype)
        return with_data(chunk, out.reshape(*x.shape[:-2], *self.dst_shape))
