"""Exception types. Each inherits the builtin a caller would already catch."""

from __future__ import annotations

__all__ = [
    "BadChunkError",
    "BuildError",
    "CacheCorruptError",
    "CalendarError",
    "CacheLockedError",
    "CacheMissError",
    "CachePlatformError",
    "DatasetClosedError",
    "ForkError",
    "InSituError",
    "IrregularTimeWarning",
    "LayoutChangedError",
    "LayoutMismatchError",
    "SlotAlignmentError",
    "SlotPlanBlockedError",
    "SettingError",
    "SlotRunError",
    "StaleCacheError",
    "StoreReadError",
    "TimeAxisError",
    "WriteBehindError",
    "WriteClaimError",
    "WriteConflictError",
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


class CalendarError(InSituError, ValueError):
    """A time coordinate cannot be decoded: its calendar needs cftime (not installed), or its units are not CF time."""


class TimeAxisError(InSituError, ValueError):
    """A time offset, missing date or frequency the sample axis's time coordinate cannot serve; names the array."""


class IrregularTimeWarning(UserWarning):
    """An offset in stored steps on a time axis with gaps or uneven steps: its step is not a fixed time there."""


class CacheCorruptError(InSituError, ValueError):
    """The persistent cache's log or files are damaged or tampered with."""


class StaleCacheError(InSituError, ValueError):
    """Persisted entries were made by different chunk transforms."""


class CacheLockedError(InSituError, OSError):
    """The cache directory is held in a conflicting way (readers against writers); names the holders' PIDs."""


class CacheMissError(InSituError, KeyError):
    """A read-only cache does not hold a chunk the pass needs."""


class CachePlatformError(InSituError, OSError):
    """The platform lacks the file locks a disk cache needs (``fcntl.flock``); names the platform."""


class WriteIntentRangeError(InSituError, IndexError):
    """A write would land outside the slot range the writer owns."""


class WriteBehindError(InSituError, RuntimeError):
    """A write made in the background (``SlotWriter(write_behind=N)``) failed; the cause is chained."""


class WriteClaimError(InSituError, RuntimeError):
    """A slot range is already claimed or completed by someone else."""


class WriteConflictError(InSituError, RuntimeError):
    """Transactional writes (icechunk) touched the same chunks or nodes; carries one line per conflict."""

    def __init__(self, message: str, conflicts: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.conflicts = conflicts


class LayoutMismatchError(InSituError, ValueError):
    """A zarr group already holds a write layout that differs from the spec; carries the diff."""

    def __init__(self, message: str, diff: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.diff = diff


class LayoutChangedError(LayoutMismatchError):
    """A group's layout changed under an open slot writer; ``.diff`` names each changed fact, nothing more is written."""


class SettingError(InSituError, ValueError):
    """A setting (``insitubatch.config``) or its ``INSITUBATCH_*`` variable holds a value it does not accept."""


class SlotAlignmentError(InSituError, ValueError):
    """A slot range or slot size is not aligned to every indexed array's chunks and shards."""


class SlotPlanBlockedError(InSituError, ValueError):
    """Unwritten index ranges cannot be split on chunk/shard boundaries; carries them."""

    def __init__(self, message: str, blocked: tuple[tuple[int, int], ...] = ()) -> None:
        super().__init__(message)
        self.blocked = blocked


class SlotRunError(InSituError, RuntimeError):
    """One or more slots of a run failed; carries the run's outcomes."""

    def __init__(self, message: str, outcomes: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.outcomes = outcomes


class DatasetClosedError(InSituError, RuntimeError):
    """The dataset was closed; open a new one to iterate again."""


class ForkError(InSituError, RuntimeError):
    """A process forked after obstore started its runtime asked obstore for a read it can no longer answer."""
