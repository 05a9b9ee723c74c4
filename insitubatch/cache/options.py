"""An ``InSituDataset``'s cache options, checked together and opened as its ``DiskCache`` (or none).

The messages name the dataset's parameters (``cache_dir``, ``persist``,
``readonly_cache``, ``reset_stale_cache``, ``cache_disk_bytes``,
``on_corrupt_cache``), since that is where a user sets them.

A store that names the version of its bytes (an icechunk snapshot:
``fingerprint.source_identity``) caches under ``cache_dir/<identity>``, one
directory per version, so a run on one snapshot never revives another's
chunks and each snapshot keeps its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from zarr.abc.store import Store

from .disk import ON_CORRUPT, DiskCache, OnCorrupt
from .fingerprint import source_identity

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
    store: Store | None = None,
) -> DiskCache | None:
    """The disk cache the options ask for, or ``None`` without ``cache_dir``.

    ``fingerprints`` is called only when there is a cache to open (hashing
    transforms is not free). ``store``, the dataset's, places the cache in
    the subdirectory of the version it reads, if it names one.

    Raises
    ------
    TypeError
        ``cache_dir`` is not a path.
    ValueError
        An option that needs another (``persist``, ``cache_dir``), or an invalid
        value; ``persist`` over a writable icechunk session with uncommitted changes.
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
    version = None if store is None else source_identity(store) if persist else _clean_identity(store)
    return DiskCache(
        cache_dir if version is None else Path(cache_dir) / version,
        persist=persist,
        readonly=readonly,
        fingerprints=fingerprints(),
        reset_stale=reset_stale,
        disk_bytes=disk_bytes,
        on_corrupt=on_corrupt,
    )


def _clean_identity(store: Store) -> str | None:
    """The store's version without ``persist``: a session with uncommitted changes only spills, under no version."""
    try:
        return source_identity(store)
    except ValueError:
        return None
