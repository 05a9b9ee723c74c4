"""``StandardScaler``: per-variable standardization with statistics fitted once and saved."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._common import digest, is_derived, readonly, require_float, with_data

if TYPE_CHECKING:
    from .core import DecodedChunk

# StandardScaler's default guard against division by a zero standard deviation.
DEFAULT_EPS = 1e-8
# Version of the file StandardScaler.save writes; load refuses any other.
SCALER_FILE_FORMAT = 1


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
    return readonly(a)


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
        if is_derived(self.cache_key, "StandardScaler"):
            params = {"eps": self.eps, "paths": list(mean)}
            arrays = [a for p in mean for a in (mean[p], std[p])]
            object.__setattr__(self, "cache_key", digest("StandardScaler", params, arrays))
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
        prepared = (readonly(m.astype(dtype)), readonly((s + self.eps).astype(dtype)))
        # a plain dict write is atomic; two threads racing here compute the same thing
        self._prepared[key] = prepared
        return prepared

    def __call__(self, chunk: DecodedChunk) -> DecodedChunk:
        x = chunk.data
        path = chunk.read.array
        require_float(x.dtype, "StandardScaler", path)
        m, denom = self._stats_for(path, tuple(x.shape[1:]), x.dtype)
        out = np.subtract(x, m, dtype=x.dtype)
        np.divide(out, denom, out=out)
        return with_data(chunk, out)

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
        arrays: dict[str, Any] = {"header": np.array(json.dumps(header))}  # Any: savez's **kwds
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
