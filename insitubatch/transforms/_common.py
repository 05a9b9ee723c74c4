"""What the built-in transforms share: their contract, the cache-key digest and small checks.

Each built-in is a callable ``DecodedChunk -> DecodedChunk`` that never writes
into the chunk it is given (decoded data may be read-only) and does all of its
per-element work in a handful of whole-array numpy calls, which release the
GIL — so the decode pool runs them in parallel. Everything that can be
computed once (regrid weights, the scaler's statistics in the chunk's dtype)
is computed once, not per chunk.

Each has a ``cache_key``: a string that changes whenever what the transform
computes changes, so a persisted cache built with one set of parameters is
never served to another. The reshaping ones (``Regrid``, ``Coarsen``) declare
``output_inner(geometry) -> (inner_shape, dtype)`` so the engine can size the
cache entry for what they return; the sample axis (axis 0 of ``chunk.data``)
is never touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .core import DecodedChunk

# Hex digits of the sha256 kept in a derived cache_key (128 bits), and what marks a key as derived.
CACHE_KEY_DIGEST_CHARS = 32
DERIVED_KEY_MARK = "/sha256:"


def is_float_kind(dtype: np.dtype) -> bool:
    return dtype.kind in "fc"


def require_float(dtype: np.dtype, who: str, path: str) -> None:
    if not is_float_kind(dtype):
        raise TypeError(
            f"{who} needs a floating-point chunk, but array {path!r} is {dtype}; "
            "cast it to float first (a chunk transform that declares output_inner with the new dtype)"
        )


def readonly(a: np.ndarray | np.generic) -> np.ndarray:
    a = np.asarray(a)  # arithmetic on a 0-d array returns a scalar
    a.flags.writeable = False
    return a


def digest(kind: str, params: Mapping[str, Any], arrays: Iterable[np.ndarray] = ()) -> str:
    """A cache key from parameters and array contents: equal inputs, equal key."""
    h = hashlib.sha256()
    h.update(json.dumps({"kind": kind, **params}, sort_keys=True).encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return f"{kind}{DERIVED_KEY_MARK}{h.hexdigest()[:CACHE_KEY_DIGEST_CHARS]}"


def is_derived(key: str | None, kind: str) -> bool:
    """A key to (re)derive: none given, or one derived before (``dataclasses.replace`` passes it on)."""
    return key is None or (isinstance(key, str) and key.startswith(f"{kind}{DERIVED_KEY_MARK}"))


def with_data(chunk: DecodedChunk, data: np.ndarray) -> DecodedChunk:
    """A new ``DecodedChunk`` like ``chunk`` holding ``data`` (the input is left as it was)."""
    return dataclasses.replace(chunk, data=data)
