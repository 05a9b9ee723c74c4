"""Moved to ``insitubatch.cache.fingerprint``; this name stays until the engine modules import from there."""

from .cache.fingerprint import *  # noqa: F403
from .cache.fingerprint import __all__  # noqa: F401
