"""An ``InSituDataset``'s cache options, checked together and opened as its ``DiskCache`` (or none).

The messages name the dataset's parameters (``cache_dir``, ``persist``,
``readonly_cache``, ``reset_stale_cache``, ``cache_disk_bytes``,
``on_corrupt_cache``), since that is where a user sets them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from .disk import ON_CORRUPT, DiskCache, OnCorrupt

__all__ = ["open_dataset_cache"]


def open_dataset_cache(
    cache_dir: str | os.PathLike | None,
    *,
    persist: bool,
    readonly: bool,
    reset_stale: bool,
    disk_bytes: int | None,
    on_corrupt: OnCorrupt,
    fingerprints: Callable[[], Mapping[str, str]],
) -> DiskCache | None:
    """The disk cache the options ask for, or ``None`` without ``cache_dir``.

    ``fingerprints`` is called only when there is a cache to open (hashing
    transforms is not free).

    Raises
    ------
    TypeError
        ``cache_dir`` is not a path.
    ValueError
        An option that needs another (``persist``, ``cache_dir``), or an invalid value.
    """
    if on_corrupt not in ON_CORRUPT:
        raise ValueError(f"on_corrupt_cache={on_corrupt!r} must be one of {ON_CORRUPT}")
    if cache_dir is None:
        if persist or readonly or reset_stale or disk_bytes is not None:
            raise ValueError(
                f"persist={persist}, readonly_cache={readonly}, reset_stale_cache={reset_stale}, "
                f"cache_disk_bytes={disk_bytes} need a cache_dir"
            )
        return None
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(
            f"cache_dir must be a directory path (str or os.PathLike) or None, got "
            f"{type(cache_dir).__name__} ({cache_dir!r})"
        )
    if readonly and not persist:
        raise ValueError("readonly_cache=True reads a persisted cache: pass persist=True with it")
    if disk_bytes is not None and not persist:
        raise ValueError(
            f"cache_disk_bytes={disk_bytes} caps a persisted cache: pass persist=True with it (spill files "
            "without persist are bounded by cache_budget_bytes)"
        )
    return DiskCache(
        cache_dir,
        persist=persist,
        readonly=readonly,
        fingerprints=fingerprints(),
        reset_stale=reset_stale,
        disk_bytes=disk_bytes,
        on_corrupt=on_corrupt,
    )
