"""Unit conversions: kelvin to degrees Celsius."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ._common import require_float, with_data

if TYPE_CHECKING:
    from .core import DecodedChunk

# 0 °C in kelvin (the SI definition of the Celsius scale).
ZERO_CELSIUS_IN_KELVIN = 273.15


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
        require_float(x.dtype, "kelvin_to_celsius", chunk.read.array)
        return with_data(chunk, np.subtract(x, x.dtype.type(ZERO_CELSIUS_IN_KELVIN), dtype=x.dtype))


kelvin_to_celsius = KelvinToCelsius()
