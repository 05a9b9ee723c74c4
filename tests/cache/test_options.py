"""CacheOptions: the six cache settings are one value, and no invalid combination of them can be built."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

from insitubatch.cache import CacheOptions, DiskCache


def _meaningful(cache_dir: object, persist: bool, readonly: bool, reset_stale: bool, disk_bytes: int | None) -> bool:
    """The rules, written independently of the class: what a combination needs to mean something."""
    if cache_dir is None:
        return not (persist or readonly or reset_stale or disk_bytes is not None)
    if readonly and (not persist or reset_stale):
        return False
    return disk_bytes is None or persist


@pytest.mark.parametrize(
    "cache_dir, persist, readonly, reset_stale, disk_bytes",
    list(itertools.product([None, "c"], [False, True], [False, True], [False, True], [None, 1 << 20])),
)
def test_exactly_the_meaningful_combinations_can_be_built(
    tmp_path: Path, cache_dir, persist, readonly, reset_stale, disk_bytes
) -> None:
    where = None if cache_dir is None else tmp_path / cache_dir
    kwargs = dict(persist=persist, readonly=readonly, reset_stale=reset_stale, disk_bytes=disk_bytes)
    if not _meaningful(where, persist, readonly, reset_stale, disk_bytes):
        with pytest.raises(ValueError):
            CacheOptions(where, **kwargs)
        return
    options = CacheOptions(where, **kwargs)
    assert (options.cache_dir, options.persist, options.readonly, options.reset_stale, options.disk_bytes) == (
        where,
        persist,
        readonly,
        reset_stale,
        disk_bytes,
    )
    assert options.mode == ("off" if where is None else "readonly" if readonly else "persist" if persist else "spill")


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        ({"persist": True}, ValueError, "persist=True, readonly_cache=False, reset_stale_cache=False, "
         "cache_disk_bytes=None need a cache_dir"),
        ({"cache_dir": "c", "readonly": True}, ValueError,
         "readonly_cache=True reads a persisted cache: pass persist=True with it"),
        ({"cache_dir": "c", "persist": True, "readonly": True, "reset_stale": True}, ValueError,
         "reset_stale_cache=True deletes files, which a readonly_cache never does; drop one of them"),
        ({"cache_dir": "c", "disk_bytes": 10}, ValueError, "cache_disk_bytes=10 caps a persisted cache: pass "
         "persist=True with it (spill files without persist are bounded by cache_budget_bytes)"),
        ({"cache_dir": "c", "persist": True, "disk_bytes": 0}, ValueError, "cache_disk_bytes=0 must be >= 1"),
        ({"cache_dir": "c", "persist": True, "disk_bytes": True}, TypeError,
         "cache_disk_bytes must be an int, got bool (True)"),
        ({"cache_dir": "c", "on_corrupt": "skip"}, ValueError,
         "on_corrupt_cache='skip' must be one of ('refetch', 'raise')"),
        ({"cache_dir": "c", "persist": "yes"}, TypeError, "persist must be True or False, got str ('yes')"),
        ({"cache_dir": "c", "readonly": 1}, TypeError, "readonly_cache must be True or False, got int (1)"),
        ({"cache_dir": "c", "reset_stale": None}, TypeError,
         "reset_stale_cache must be True or False, got NoneType (None)"),
        ({"cache_dir": 5}, TypeError, "cache_dir must be a directory path (str or os.PathLike) or None, got int (5)"),
    ],
)  # fmt: skip
def test_each_refusal_names_the_dataset_parameters(kwargs: dict, exc: type, message: str) -> None:
    with pytest.raises(exc, match=f"^{re.escape(message)}$"):
        CacheOptions(**kwargs)


def test_a_value_normalised_once_and_frozen(tmp_path: Path) -> None:
    options = CacheOptions(str(tmp_path), persist=np.bool_(True), disk_bytes=np.int64(7))
    assert options.cache_dir == tmp_path and type(options.persist) is bool and type(options.disk_bytes) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.readonly = True  # type: ignore[misc]
    assert options == CacheOptions(tmp_path, persist=True, disk_bytes=7)


def test_disk_cache_refuses_with_the_same_words(tmp_path: Path) -> None:
    """DiskCache's flags go through CacheOptions: one set of checks, one set of messages."""
    with pytest.raises(ValueError) as from_options:
        CacheOptions(tmp_path, persist=False, readonly=True)
    with pytest.raises(ValueError) as from_cache:
        DiskCache(tmp_path, persist=False, readonly=True, fingerprints={})
    assert str(from_cache.value) == str(from_options.value)
    assert list(tmp_path.iterdir()) == []  # refused before anything touched the directory


def test_a_plain_store_caches_in_cache_dir_itself(tmp_path: Path) -> None:
    store = zarr.storage.MemoryStore()
    assert CacheOptions(tmp_path, persist=True).directory_for(store) == tmp_path
    assert CacheOptions(tmp_path).directory_for(None) == tmp_path
    assert CacheOptions().directory_for(store) is None
