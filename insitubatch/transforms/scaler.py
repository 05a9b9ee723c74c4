"""Built-in chunk transforms: standardization, bilinear regrid, block-mean coarsening, K→°C.

Each one is a callable ``DecodedChunk -> DecodedChunk`` that never writes into
the chunk it is given (decoded data may be read-only) and does all of its
per-element work in a handful of whole-array numpy calls, which release the
GIL — so the decode pool runs them in parallel. Everything that can be
computed once (regrid weights, the scaler's statistics in the chunk's dtype)
is computed once, not per chunk.

Each has a ``cache_key``: a string that changes whenever what the transform
computes changes, so a persisted cache built with one set of parameters is
never served to another. The reshaping ones (``Regrid``, ``Coarsen``) declare
``output_inner(geometry) -> (inner_shape, dtype)`` so the engine can size the
cache slot for what they return; the sample axis (axis 0 of ``chunk.data``)
is never touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:  # transforms.py re-exports this module; import it lazily to keep that one-way
    from ..geometry import ArrayGeometry
    from .core import DecodedChunk

__all__ = ["Coarsen", "KelvinToCelsius", "Regrid", "StandardScaler", "kelvin_to_celsius"]

# 0 °C in kelvin (the SI definition of the Celsius scale).
ZERO_CELSIUS_IN_KELVIN = 273.15
# StandardScaler's default guard against division by a zero standard deviation.
DEFAULT_EPS = 1e-8
# Version of the file StandardScaler.save writes; load refuses any other.
SCALER_FILE_FORMAT = 1
# A regrid target this close to the edge of the source grid, as a fraction of
# one source spacing, is on the edge (float round-off), not outside it.
EDGE_TOLERANCE = 1e-6
# What Regrid does with a target outside the source grid.
OUT_OF_RANGE_POLICIES = ("raise", "clamp")
# Longitude period, in degrees, for Regrid(periodic_lon=True).
FULL_CIRCLE_DEGREES = 360.0
# Hex digits of the sha256 kept in a derived cache_key (128 bits), and what marks a key as derived.
CACHE_KEY_DIGEST_CHARS = 32
DERIVED_KEY_MARK = "/sha256:"


# -- shared helpers -------------------------------------------------------------
def _is_float_kind(dtype: np.dtype) -> bool:
    return dtype.kind in "fc"


def _require_float(dtype: np.dtype, who: str, path: str) -> None:
    if not _is_float_kind(dtype):
        raise TypeError(
            f"{who} needs a floating-point chunk, but array {path!r} is {dtype}; "
            "cast it to float first (a chunk transform that declares output_inner with the new dtype)"
        )


def _readonly(a: np.ndarray | np.generic) -> np.ndarray:
    a = np.asarray(a)  # arithmetic on a 0-d array returns a scalar
    a.flags.writeable = False
    return a


def _digest(kind: str, params: Mapping[str, Any], arrays: Iterable[np.ndarray] = ()) -> str:
    """A cache key from parameters and array contents: equal inputs, equal key."""
    h = hashlib.sha256()
    h.update(json.dumps({"kind": kind, **params}, sort_keys=True).encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return f"{kind}{DERIVED_KEY_MARK}{h.hexdigest()[:CACHE_KEY_DIGEST_CHARS]}"


def _is_derived(key: str | None, kind: str) -> bool:
    """A key to (re)derive: none given, or one derived before (``dataclasses.replace`` passes it on)."""
    return key is None or (isinstance(key, str) and key.startswith(f"{kind}{DERIVED_KEY_MARK}"))


def _with_data(chunk: DecodedChunk, data: np.ndarray) -> DecodedChunk:
    """A new ``DecodedChunk`` like ``chunk`` holding ``data`` (the input is left as it was)."""
    return dataclasses.replace(chunk, data=data)


def _transform_name(obj: object) -> str:
    return type(obj).__name__


# -- kelvin_to_celsius ------------------------------------------------------------
@dataclass(frozen=True)
class KelvinToCelsius:
    """Kelvin to degrees Celsius, ``x - 273.15`` in the chunk's own float dtype.

    Use the ready instance ``kelvin_to_celsius``, scoped to the temperature
    arrays: ``applies(["t2m"], kelvin_to_celsius)``.

    Raises
    ------
    TypeError
        The chunk is not floating-point (an integer Celsius would round).
    """

    cache_key: ClassVar[str] = "insitubatch.kelvin_to_celsius/v1"

    def __call__(self, chunk: DecodedChunk) -> DecodedChunk:
        x = chunk.data
        _require_float(x.dtype, "kelvin_to_celsius", chunk.read.array)
        return _with_data(chunk, np.subtract(x, x.dtype.type(ZERO_CELSIUS_IN_KELVIN), dtype=x.dtype))


kelvin_to_celsius = KelvinToCelsius()


# -- StandardScaler ---------------------------------------------------------------
def _stats_array(value: Any, which: str, path: str) -> np.ndarray:
    try:
        a = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{which}[{path!r}] must be numeric (a number or an array), got {type(value).__name__}"
        ) from exc
    bad = int(np.count_nonzero(~np.isfinite(a)))
    if bad:
        raise ValueError(f"{which}[{path!r}] has {bad} non-finite value(s) (NaN or inf); statistics must be finite")
    return _readonly(a)


@dataclass(frozen=True, eq=False)
class StandardScaler:
    """Standardize with fixed, pre-fit statistics: ``(x - mean) / (std + eps)``.

    The same statistics apply to every chunk of an array — they are never
    recomputed per chunk. Statistics are keyed by zarr array path (what
    ``chunk.read.array`` carries) and shaped to broadcast against one
    sample's inner axes: a scalar or ``(1, 1)`` for a surface field,
    ``(level, 1, 1)`` per level, or the full inner shape per grid point.

    Parameters
    ----------
    mean, std
        ``{array path: statistic}``, with the same paths in both; finite
        values; ``std >= 0``.
    eps
        Added to ``std`` before dividing; ``>= 0``, and ``> 0`` when any ``std`` is 0.
    cache_key
        The transform's identity in a persistent cache. ``None`` derives one
        from the statistics and ``eps`` (a re-fit gets a new key, so a cache
        built with the old statistics is reported stale instead of served).
        A derived key passed back in (``dataclasses.replace``) is re-derived.

    Notes
    -----
    A floating-point chunk is standardized in its own dtype (float32 in,
    float32 out); an integer chunk raises ``TypeError``. Wrap the scaler with
    ``applies(paths, scaler)`` to run it on the arrays it has statistics for;
    ``validate_scope(paths)`` checks such a scope.

    Raises
    ------
    TypeError
        ``mean``/``std`` are not mappings, or hold non-numeric values.
    ValueError
        Different paths in ``mean`` and ``std``, no paths, non-finite values,
        a negative ``std``, statistics that do not broadcast together, or a
        zero ``std`` with ``eps=0``.
    """

    mean: Mapping[str, Any]
    std: Mapping[str, Any]
    eps: float = DEFAULT_EPS
    cache_key: str | None = None
    _derived_key: bool = field(default=False, init=False, repr=False)
    _prepared: dict[tuple[str, tuple[int, ...], str], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        for which, stats in (("mean", self.mean), ("std", self.std)):
            if not isinstance(stats, Mapping):
                raise TypeError(f"{which} must be a dict of array path -> statistic, got {type(stats).__name__}")
        only_mean = sorted(set(self.mean) - set(self.std))
        only_std = sorted(set(self.std) - set(self.mean))
        if only_mean or only_std:
            raise ValueError(
                f"mean and std must have the same array paths; only in mean: {only_mean}, only in std: {only_std}"
            )
        if not self.mean:
            raise ValueError("mean and std are empty: give statistics for at least one array path")
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
            raise TypeError(f"eps must be a number, got {type(eps).__name__}")
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps={eps!r} must be finite and >= 0")
        mean: dict[str, np.ndarray] = {}
        std: dict[str, np.ndarray] = {}
        for path in sorted(self.mean):
            m = _stats_array(self.mean[path], "mean", path)
            s = _stats_array(self.std[path], "std", path)
            if s.size and s.min() < 0:
                raise ValueError(
                    f"std[{path!r}] has negative values (min {float(s.min())!r}); a standard deviation is >= 0"
                )
            if eps == 0 and s.size and s.min() == 0:
                raise ValueError(f"std[{path!r}] has zeros and eps=0, which would divide by zero; give eps > 0")
            try:
                np.broadcast_shapes(m.shape, s.shape)
            except ValueError:
                raise ValueError(
                    f"mean[{path!r}] shape {m.shape} and std[{path!r}] shape {s.shape} do not broadcast together"
                ) from None
            mean[str(path)], std[str(path)] = m, s
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "eps", float(eps))
        if _is_derived(self.cache_key, "StandardScaler"):
            params = {"eps": self.eps, "paths": list(mean)}
            arrays = [a for p in mean for a in (mean[p], std[p])]
            object.__setattr__(self, "cache_key", _digest("StandardScaler", params, arrays))
            object.__setattr__(self, "_derived_key", True)
        elif not isinstance(self.cache_key, str) or not self.cache_key:
            raise TypeError(f"cache_key must be a non-empty str or None, got {self.cache_key!r}")

    def __repr__(self) -> str:
        shapes = {p: m.shape for p, m in self.mean.items()}
        return f"StandardScaler(paths={shapes}, eps={self.eps!r}, cache_key={self.cache_key!r})"

    @property
    def paths(self) -> tuple[str, ...]:
        """The array paths this scaler has statistics for, sorted."""
        return tuple(self.mean)

    def validate_scope(self, paths: Iterable[str]) -> None:
        """Raise ``ValueError`` naming any of ``paths`` this scaler has no statistics for."""
        missing = sorted({str(p) for p in paths} - set(self.mean))
        if missing:
            raise ValueError(
                f"StandardScaler is scoped to {missing}, which it has no statistics for; "
                f"it has statistics for {list(self.mean)}"
            )

    def _stats_for(self, path: str, inner: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std + eps)`` in ``dtype``, checked against ``inner`` once per shape and dtype."""
        key = (path, inner, dtype.str)
        prepared = self._prepared.get(key)
        if prepared is not None:
            return prepared
        if path not in self.mean:
            raise KeyError(
                f"StandardScaler has no statistics for array {path!r}; it has statistics for "
                f"{list(self.mean)} (scope it with applies({list(self.mean)}, scaler))"
            )
        m, s = self.mean[path], self.std[path]
        for which, a in (("mean", m), ("std", s)):
            fits = a.ndim <= len(inner)
            if fits:
                try:
                    fits = np.broadcast_shapes(inner, a.shape) == inner
                except ValueError:
                    fits = False
            if not fits:
                raise ValueError(
                    f"{which}[{path!r}] has shape {a.shape}, which does not broadcast against the chunk's "
                    f"inner shape {inner} without enlarging it; use e.g. (1, 1) for a surface field or "
                    "(level, 1, 1) per level"
                )
        prepared = (_readonly(m.astype(dtype)), _readonly((s + self.eps).astype(dtype)))
        # a plain dict write is atomic; two threads racing here compute the same thing
        self._prepared[key] = prepared
        return prepared

    def __call__(self, chunk: DecodedChunk) -> DecodedChunk:
        x = chunk.data
        path = chunk.read.array
        _require_float(x.dtype, "StandardScaler", path)
        m, denom = self._stats_for(path, tuple(x.shape[1:]), x.dtype)
        out = np.subtract(x, m, dtype=x.dtype)
        np.divide(out, denom, out=out)
        return _with_data(chunk, out)

    # -- persistence ----------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the statistics to one ``.npz`` file at exactly ``path``; return it.

        The file holds ``mean_<i>``/``std_<i>`` arrays and a JSON header
        (format, paths, ``eps``, a ``cache_key`` you gave); nothing is pickled.
        """
        path = Path(path)
        header = {
            "format": SCALER_FILE_FORMAT,
            "kind": "StandardScaler",
            "paths": list(self.mean),
            "eps": self.eps,
            "cache_key": None if self._derived_key else self.cache_key,
        }
        arrays: dict[str, np.ndarray] = {"header": np.array(json.dumps(header))}
        for i, p in enumerate(self.mean):
            arrays[f"mean_{i}"] = self.mean[p]
            arrays[f"std_{i}"] = self.std[p]
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)  # a reader never sees a half-written file
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> StandardScaler:
        """Read a scaler written by ``save``.

        Raises
        ------
        ValueError
            The file is not a StandardScaler file of a format this version reads.
        """
        with np.load(Path(path), allow_pickle=False) as npz:
            if "header" not in npz.files:
                raise ValueError(f"{os.fspath(path)!r} is not a StandardScaler file (no header entry)")
            header = json.loads(str(npz["header"]))
            if header.get("kind") != "StandardScaler" or header.get("format") != SCALER_FILE_FORMAT:
                raise ValueError(
                    f"{os.fspath(path)!r} holds kind={header.get('kind')!r} format={header.get('format')!r}; "
                    f"this version reads kind='StandardScaler' format={SCALER_FILE_FORMAT}"
                )
            paths = header["paths"]
            mean = {p: npz[f"mean_{i}"] for i, p in enumerate(paths)}
            std = {p: npz[f"std_{i}"] for i, p in enumerate(paths)}
        return cls(mean, std, eps=header["eps"], cache_key=header["cache_key"])


# -- Regrid -----------------------------------------------------------------------
def _coordinate(value: Any, name: str) -> np.ndarray:
    a = np.array(value, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of coordinates, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has non-finite coordinates")
    return _readonly(a)


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
        object.__setattr__(self, "_index", _readonly(index.astype(np.intp)))
        object.__setattr__(self, "_weights", _readonly(weights))
        if _is_derived(self.cache_key, "Regrid"):
            params = {"out_of_range": self.out_of_range, "periodic_lon": bool(self.periodic_lon)}
            key = _digest("Regrid", params, coords.values())
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
            w = self._typed_weights[dtype.str] = _readonly(self._weights.astype(dtype))
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
        return _with_data(chunk, out.reshape(*x.shape[:-2], *self.dst_shape))


# -- Coarsen ----------------------------------------------------------------------
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
        return dtype if _is_float_kind(dtype) else np.dtype(np.float64)

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
        return _with_data(chunk, out.astype(self._out_dtype(chunk.data.dtype), copy=False))
