"""Several writers over one cache_dir: each revives what the others finished, claims keep writes apart.

Two ``DiskCache`` objects in one process hold their own locks exactly like two
processes (``flock`` belongs to an open file), so most of this runs in-process;
``test_lock`` and ``tests/cache/test_cache_sharing.py`` use real processes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import put_chunk

from insitubatch.cache import LOG_NAME, DiskCache, persisted_basename, spill_basename
from insitubatch.errors import CacheLockedError, StaleCacheError

FP_A, FP_B = "0123456789abcdef", "fedcba9876543210"
PATH = "t2m"
TILE = (4, 5, 4)
SHAPES = [TILE]


def _tile(value: float) -> np.ndarray:
    return np.full(TILE, value, dtype=np.float32)


def _writer(d: Path, fp: str = FP_A, **kw) -> DiskCache:
    return DiskCache(d, persist=True, fingerprints={PATH: fp}, **kw)


def _put(c: DiskCache, chunk: int, value: float = 1.0) -> bool:
    return put_chunk(c, PATH, chunk, _tile(value))


def test_each_writer_revives_what_the_other_finished(tmp_path: Path) -> None:
    with _writer(tmp_path) as a, _writer(tmp_path) as b:
        assert a.find(PATH, 0, SHAPES, np.float32).claimed and _put(a, 0, 10.0)
        (tile,) = b.find(PATH, 0, SHAPES, np.float32).tiles
        assert (tile == 10.0).all()
        assert (b.revived, b.revived_from_others) == (1, 1)
        # b claims chunk 1 first: a is told it is busy, makes nothing, and revives b's file once it is there
        assert b.find(PATH, 1, SHAPES, np.float32).claimed
        busy = a.find(PATH, 1, SHAPES, np.float32)
        assert busy.busy and busy.tiles is None
        assert a.begin(PATH, 1, 1, TILE, np.float32) is None and a.refused == {"busy": 1}
        assert _put(b, 1, 11.0)
        found = a.find(PATH, 1, SHAPES, np.float32)
        assert found.from_other and (found.tiles[0] == 11.0).all()
        assert a.written == b.written == 1
    with _writer(tmp_path) as c:  # alone: both segments are folded into the base log
        assert set(c.entries()) == {(PATH, 0), (PATH, 1)}
        assert len((tmp_path / LOG_NAME).read_bytes().splitlines()) == 3


def test_a_released_claim_is_taken_over_and_a_finished_one_is_revived(tmp_path: Path) -> None:
    with _writer(tmp_path) as a, _writer(tmp_path) as b:
        assert a.find(PATH, 0, SHAPES, np.float32).claimed
        a.release(PATH, 0)  # a failed fetch: the chunk is free again
        assert b.find(PATH, 0, SHAPES, np.float32).claimed
        assert a.find(PATH, 0, SHAPES, np.float32).busy
        b.close()  # a writer closing with a claim lets go of it
        assert a.find(PATH, 0, SHAPES, np.float32).claimed


def test_housekeeping_waits_for_a_writer_that_is_alone(tmp_path: Path) -> None:
    with _writer(tmp_path) as first:
        _put(first, 0)
    with _writer(tmp_path) as live:  # alone at open: folded the first writer's segment
        _put(live, 1)
        base = tmp_path / LOG_NAME
        ino = base.stat().st_ino
        # dead writers' leftovers: a temporary file and a spill file of a writer that no longer runs
        dead = "f" * 16
        (tmp_path / f".{persisted_basename(PATH, 9, FP_A)}.{dead}-0.tmp").write_bytes(b"x")
        (tmp_path / spill_basename(PATH, 9, dead)).write_bytes(b"x")
        orphan = tmp_path / persisted_basename(PATH, 8, FP_A)  # published, never logged
        orphan.write_bytes(b"x")
        with _writer(tmp_path) as second:
            assert set(second.entries()) == {(PATH, 0), (PATH, 1)}
            assert base.stat().st_ino == ino  # not alone: the logs stay as they are
            assert orphan.exists()  # it could be a live writer's file about to be logged
            names = {p.name for p in tmp_path.iterdir()}
            assert not any(dead in n for n in names)  # a dead writer's are gone all the same
    with _writer(tmp_path):  # alone again: compacted, the orphan deleted
        assert not orphan.exists() and base.stat().st_ino != ino


def test_a_stale_reset_needs_the_directory_to_itself(tmp_path: Path) -> None:
    with _writer(tmp_path) as old:
        _put(old, 0)
        with pytest.raises(StaleCacheError, match="'t2m'"):
            _writer(tmp_path, FP_B)
        with pytest.raises(CacheLockedError, match=f"PID {os.getpid()}.*reset the stale arrays"):
            _writer(tmp_path, FP_B, reset_stale=True)
    with _writer(tmp_path, FP_B, reset_stale=True) as new:
        assert new.dropped == {"stale": 1} and new.entries() == {}


def test_writers_of_other_transforms_never_share_a_file(tmp_path: Path) -> None:
    with _writer(tmp_path, FP_A) as a, _writer(tmp_path, FP_B) as b:  # both open before either logged
        assert _put(a, 0, 1.0) and _put(b, 0, 2.0)
        assert persisted_basename(PATH, 0, FP_A) != persisted_basename(PATH, 0, FP_B)
        assert (a.lookup(PATH, 0, SHAPES, np.float32)[0] == 1.0).all()
        b.evict(PATH, 0)
        assert (b.lookup(PATH, 0, SHAPES, np.float32)[0] == 2.0).all()
        assert a.revived_from_others == b.revived_from_others == 0


def test_the_disk_budget_counts_every_writer(tmp_path: Path, caplog) -> None:
    with _writer(tmp_path) as probe:
        _put(probe, 99)
        size = (tmp_path / persisted_basename(PATH, 99, FP_A)).stat().st_size
    budget = 4 * size  # chunk 99 and three more
    with caplog.at_level(logging.WARNING, logger="insitubatch"):
        with _writer(tmp_path, disk_bytes=budget) as a, _writer(tmp_path, disk_bytes=budget) as b:
            assert _put(a, 0) and _put(a, 1) and _put(b, 2)
            assert not _put(b, 3) and not _put(a, 4)  # a sees b's chunk in the log
            assert a.refused == b.refused == {"budget": 1} and a.over_budget
            assert a.disk_used_bytes == b.disk_used_bytes == budget
            assert a.find(PATH, 3, SHAPES, np.float32).claimed
            assert a.begin(PATH, 3, 1, TILE, np.float32) is None  # over the budget: the claim goes back
            assert b.find(PATH, 3, SHAPES, np.float32).claimed
    assert sum(p.stat().st_size for p in tmp_path.glob("*.npy")) <= budget
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # the engine warns, once per pass
