"""Chunk transforms: the engine's contract (``core``) and the built-ins, one module each."""

from __future__ import annotations

from .core import *  # noqa: F403
from .core import __all__  # noqa: F401
