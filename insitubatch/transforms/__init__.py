"""Chunk transforms: the engine's contract (``core``) and the built-ins, one module each.

``core`` never imports a built-in; this package's namespace offers both.
"""

from __future__ import annotations

from .coarsen import Coarsen
from .core import (
    ChunkRead,
    ChunkTransform,
    DecodedChunk,
    Scoped,
    applies,
    check_scopes,
    output_geometry,
    pipeline_for,
    run_pipeline,
    stage_outputs,
)
from .regrid import Regrid
from .scaler import StandardScaler
from .units import KelvinToCelsius, kelvin_to_celsius

__all__ = [
    "ChunkRead",
    "ChunkTransform",
    "Coarsen",
    "DecodedChunk",
    "KelvinToCelsius",
    "Regrid",
    "Scoped",
    "StandardScaler",
    "applies",
    "check_scopes",
    "kelvin_to_celsius",
    "output_geometry",
    "pipeline_for",
    "run_pipeline",
    "stage_outputs",
]
