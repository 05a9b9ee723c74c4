"""The disk tier of the chunk pool, optionally persisted across runs (see ``disk``)."""

from __future__ import annotations

from .disk import *  # noqa: F403
from .disk import __all__ as _disk_all
from .fingerprint import *  # noqa: F403
from .fingerprint import __all__ as _fingerprint_all

__all__ = sorted([*_disk_all, *_fingerprint_all])
