"""Exception types. Each inherits the builtin a caller would already catch."""

from __future__ import annotations

__all__ = [
    "BadChunkError",
    "BuildError",
    "CacheCorruptError",
    "CacheLockedError",
    "CacheMissError",
    "InSituError",
    "StaleCacheError",
    "StoreReadError",
    "WriteClaimError",
    "WriteIntentRangeError",
]


class InSituError(Exception):
    """Root of every error insitubatch raises on purpose."""


class BuildError(InSituError, ImportError):
    """The compiled kernels are missing: the package was not built."""


class StoreReadError(InSituError, OSError):
    """A store request failed; names the array, chunk and key."""


class BadChunkError(InSituError, ValueError):
    """A stored chunk could not be decoded; names the array, chunk and key."""


class CacheCorruptError(InSituError, ValueError):
    """The persistent cache's log or files are damaged or tampered with."""


class StaleCacheError(InSituError, ValueError):
    """Persisted entries were made by different chunk transforms."""


class CacheLockedError(InSituError, OSError):
    """Another process holds the cache directory's writer lock."""


class CacheMissError(InSituError, KeyError):
    """A read-only cache does not hold a chunk the pass needs."""


class WriteIntentRangeError(InSituError, IndexError):
    """A write would land outside the slot range the writer owns."""


class WriteClaimError(InSituError, RuntimeError):
    """A slot range is already claimed or completed by someone else."""
