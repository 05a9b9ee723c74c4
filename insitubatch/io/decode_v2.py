"""A zarr v2 array's chunk decode: the numcodecs compressor, its filters in reverse, then a view.

Split from ``insitubatch.io.decode``, which picks this chain for v2 arrays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numcodecs.compat import ensure_ndarray_like

from .._zarr_compat import ArraySpec, ArrayV2Metadata
from .direct import DecodeFailure, DirectDecode, check_blosc_frame, is_blosc

__all__ = ["V2Chain"]


class V2Chain:
    """A v2 array's numcodecs compressor, then its filters in reverse, then a dtype/order view."""

    def __init__(self, metadata: ArrayV2Metadata, spec: ArraySpec) -> None:
        self.shape = tuple(metadata.chunks)
        self.dtype = spec.dtype.to_native_dtype()
        self.order = metadata.order
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self._compressor = metadata.compressor
        self._filters = tuple(reversed(metadata.filters or ()))
        plain = not self._filters and (self.order == "C" or len(self.shape) <= 1)
        native = not self.dtype.hasobject and self.dtype.isnative
        self._direct = DirectDecode.of(self._compressor) if self._compressor and plain and native else None

    @property
    def direct(self) -> DirectDecode | None:
        """The compressor stage that decodes a chunk straight into its output, where it alone suffices."""
        return self._direct

    def decode_into(self, raw: np.ndarray, out: np.ndarray) -> None:
        """Decode into ``out`` (the chunk's shape, C-contiguous, writeable)."""
        if self._direct is not None and out.dtype == self.dtype and self._direct(raw, out):
            return
        out[...] = self(raw)

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        data: Any = raw
        for codec in ((self._compressor,) if self._compressor else ()) + self._filters:
            if is_blosc(codec):
                check_blosc_frame(data)
            try:
                data = codec.decode(data)
            except Exception as exc:  # every codec has its own failure types
                raise DecodeFailure(f"{type(codec).__name__} failed: {exc}") from exc
        flat = ensure_ndarray_like(data).reshape(-1, order="A")
        if flat.nbytes != self.nbytes:
            raise DecodeFailure(f"decoded {flat.nbytes} bytes, expected {self.nbytes}")
        return flat.view(self.dtype).reshape(self.shape, order=self.order)
