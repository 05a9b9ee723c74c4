"""A dataset's six disk-cache settings as one value, checked together when it is built.

``CacheOptions`` is the one place the cache's settings are checked: each
value's type and range, and every combination that has no meaning (a
readonly cache that is not persisted, a disk cap on spill space, a reset a
readonly reader could not do, any setting without a ``cache_dir``). An
instance is therefore always a valid combination, and what is built from it
(``DiskCache`` and its parts) trusts it. The messages name the dataset's
parameters (``cache_dir``, ``persist``, ``readonly_cache``,
``reset_stale_cache``, ``cache_disk_bytes``, ``on_corrupt_cache``), since
that is where a user sets them.

A store that names the version of its bytes (an icechunk snapshot:
``fingerprint.source_identity``) caches under ``cache_dir/<identity>``, one
directory per version, so a run on one snapshot never revives another's
chunks and each snapshot keeps its own (``CacheOptions.directory_for``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from zarr.abc.store import Store

from ..validation import Flag, Instance, Interval, Options, Table, check_params
from .fingerprint import source_identity

__all__ = ["CACHE_PARAMETERS", "ON_CORRUPT", "CacheOptions", "OnCorrupt"]

OnCorrupt = Literal["refetch", "raise"]
ON_CORRUPT: tuple[OnCorrupt, ...] = get_args(OnCorrupt)
# each setting's constraints, under the dataset's parameter names (``InSituDataset``'s table holds these rows);
# the flags come first so that a flag without a ``cache_dir`` is named before the directory's type
CACHE_PARAMETERS: Table = {
    "persist": [Flag()],
    "readonly_cache": [Flag()],
    "reset_stale_cache": [Flag()],
    "cache_disk_bytes": [Interval(1), None],
    "on_corrupt_cache": [Options(*ON_CORRUPT)],
    "cache_dir": [Instance((str, os.PathLike), "a directory path (str or os.PathLike) or None"), None],
}


@dataclass(frozen=True, init=False)
class CacheOptions:
    """Where and how a dataset caches chunks on disk; an instance is always a valid combination.

    Parameters
    ----------
    cache_dir
        Directory of the tile files; ``None``: no disk cache (and then no
        other option may be set).
    persist
        Keep the files across runs and log each completed chunk; without it
        ``cache_dir`` is spill space.
    readonly
        Only read a warmed persisted cache (``readonly_cache``).
    reset_stale
        Rebuild the arrays whose chunk transforms changed instead of raising
        (``reset_stale_cache``); a writer's option.
    disk_bytes
        Most bytes the persisted tile files may take (``cache_disk_bytes``);
        ``None``: up to a full disk.
    on_corrupt
        A damaged tile file is re-fetched (``"refetch"``) or raises
        (``"raise"``) (``on_corrupt_cache``).

    Raises
    ------
    TypeError
        ``cache_dir`` is not a path, a flag is not a bool, ``disk_bytes`` is
        not an int.
    ValueError
        ``disk_bytes`` is not positive, ``on_corrupt`` is not one of
        ``ON_CORRUPT``, or an option needs another that is not set.
    """

    cache_dir: Path | None
    persist: bool
    readonly: bool
    reset_stale: bool
    disk_bytes: int | None
    on_corrupt: OnCorrupt

    def __init__(
        self,
        cache_dir: str | os.PathLike | None = None,
        *,
        persist: bool = False,
        readonly: bool = False,
        reset_stale: bool = False,
        disk_bytes: int | None = None,
        on_corrupt: OnCorrupt = "refetch",
    ) -> None:
        given: dict[str, Any] = {"persist": persist, "readonly_cache": readonly, "reset_stale_cache": reset_stale}
        given |= {"cache_disk_bytes": disk_bytes, "on_corrupt_cache": on_corrupt, "cache_dir": cache_dir}
        checked = check_params(CACHE_PARAMETERS, given)
        persist, readonly, reset_stale = checked["persist"], checked["readonly_cache"], checked["reset_stale_cache"]
        disk_bytes, on_corrupt = checked["cache_disk_bytes"], checked["on_corrupt_cache"]
        if cache_dir is None:
            if persist or readonly or reset_stale or disk_bytes is not None:
                raise ValueError(
                    f"persist={persist}, readonly_cache={readonly}, reset_stale_cache={reset_stale}, "
                    f"cache_disk_bytes={disk_bytes} need a cache_dir"
                )
        elif readonly and not persist:
            raise ValueError("readonly_cache=True reads a persisted cache: pass persist=True with it")
        elif readonly and reset_stale:
            raise ValueError(
                "reset_stale_cache=True deletes files, which a readonly_cache never does; drop one of them"
            )
        elif disk_bytes is not None and not persist:
            raise ValueError(
                f"cache_disk_bytes={disk_bytes} caps a persisted cache: pass persist=True with it (spill files "
                "without persist are bounded by cache_budget_bytes)"
            )
        # frozen: each checked value is set once, here
        object.__setattr__(self, "cache_dir", None if cache_dir is None else Path(cache_dir))
        object.__setattr__(self, "persist", persist)
        object.__setattr__(self, "readonly", readonly)
        object.__setattr__(self, "reset_stale", reset_stale)
        object.__setattr__(self, "disk_bytes", disk_bytes)
        object.__setattr__(self, "on_corrupt", on_corrupt)

    @property
    def mode(self) -> str:
        """``"readonly"``, ``"persist"`` or ``"spill"`` (``"off"`` without a ``cache_dir``)."""
        if self.cache_dir is None:
            return "off"
        return "readonly" if self.readonly else ("persist" if self.persist else "spill")

    def directory_for(self, store: Store | None) -> Path | None:
        """The directory caching ``store``'s chunks: ``cache_dir``, or its subdirectory of the version ``store`` reads.

        Raises
        ------
        ValueError
            ``persist`` over a writable icechunk session with uncommitted
            changes (which reads no snapshot's bytes).
        """
        if self.cache_dir is None or store is None:
            return self.cache_dir
        version = source_identity(store) if self.persist else _clean_identity(store)
        return self.cache_dir if version is None else self.cache_dir / version


def _clean_identity(store: Store) -> str | None:
    """The store's version without ``persist``: a session with uncommitted changes only spills, under no version."""
    try:
        return source_identity(store)
    except ValueError:
        return None
