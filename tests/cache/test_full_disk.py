"""A full disk stops a DiskCache writing, with one WARNING, and nothing half-written is ever revived.

Each case runs on a real small filesystem (a tmpfs, where this machine may
mount one) and, always, with ``ENOSPC`` injected at the tile-file write path.
The engine's side (a pass that goes on, equal to zarr) is ``tests/cache/test_cache_faults.py``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import FullAfter, can_mount_tmpfs, put_chunk, small_tmpfs

from insitubatch.cache import SHARED_DIR, DiskCache, persisted_basename
from insitubatch.cache import ledger as ledger_mod

FP = "0123456789abcdef"
PATH = "t2m"
# 16 KiB tiles: a 160 KiB tmpfs holds a handful of tile files next to the logs and the lock
TILE = (4, 32, 32)
SHAPES = [TILE]
TMPFS_SIZE = "160k"
needs_mount = pytest.mark.skipif(
    not can_mount_tmpfs(), reason="mounting a tmpfs needs root; the injected-ENOSPC twin always runs"
)


def _tile(chunk: int) -> np.ndarray:
    return np.full(TILE, chunk, dtype=np.float32)


def _writer(d: Path, **kw) -> DiskCache:
    return DiskCache(d, persist=kw.pop("persist", True), fingerprints={PATH: FP}, **kw)


def _put(c: DiskCache, chunk: int) -> bool:
    return put_chunk(c, PATH, chunk, _tile(chunk))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a real filesystem of ``TMPFS_SIZE`` bytes."""
    d = tmp_path / "small"
    d.mkdir()
    with small_tmpfs(d, TMPFS_SIZE):
        yield d


def _full_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]


def _fill(d: Path, caplog: pytest.LogCaptureFixture) -> list[int]:
    """Write chunks until the disk refuses one; check the refusal and the one WARNING; return those written."""
    written = []
    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(d) as c:
        for chunk in range(64):
            if not _put(c, chunk):
                break
            written.append(chunk)
        assert 0 < len(written) < 64
        assert not c.persisting and c.refused == {"full": 1}
        assert not _put(c, 99) and c.refused == {"full": 2}  # persisting stays off for this cache
        for chunk in written:  # what it wrote is still served
            assert (c.lookup(PATH, chunk, SHAPES, np.float32)[0] == chunk).all()
    (warning,) = _full_warnings(caplog)
    assert repr(str(d)) in warning and "No space left on device" in warning
    assert re.search(r"writing \d+ bytes with -?\d+ bytes free", warning)
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]  # nothing half-written is left
    return written


def _check_revived(d: Path, written: list[int]) -> None:
    with _writer(d) as c:
        assert set(c.entries()) == {(PATH, k) for k in written}
        for chunk in written:
            assert (c.lookup(PATH, chunk, SHAPES, np.float32)[0] == chunk).all()
        assert c.lookup(PATH, written[-1] + 1, SHAPES, np.float32) is None


def test_injected_enospc_stops_persisting_with_one_warning(
    tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "posix_fallocate", FullAfter(5))
    written = _fill(tmp_path, caplog)
    assert written == [0, 1, 2, 3, 4]
    monkeypatch.undo()  # the user frees space: a new cache writes again
    _check_revived(tmp_path, written)
    with _writer(tmp_path) as c:
        assert _put(c, 5) and c.persisting


@needs_mount
def test_a_real_full_filesystem_stops_persisting_with_one_warning(small_disk: Path, caplog) -> None:
    d = small_disk
    written = _fill(d, caplog)
    _check_revived(d, written)
    for chunk in written[:2]:  # the user frees space
        (d / persisted_basename(PATH, chunk, FP)).unlink()
    with _writer(d) as c:
        assert c.persisting and _put(c, 100)
        assert c.lookup(PATH, 0, SHAPES, np.float32) is None  # a deleted file is a miss, never garbage


@pytest.mark.invariant
def test_a_full_disk_while_logging_leaves_no_line_and_nothing_to_revive(
    tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_then_full(fd: int, entry) -> None:
        os.write(fd, entry.to_line()[:20])  # a torn line, as a disk filling mid-append leaves
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(tmp_path) as c:
        assert _put(c, 0)
        monkeypatch.setattr(ledger_mod, "append_entry", half_then_full)
        views = c.find(PATH, 1, SHAPES, np.float32)
        assert views.claimed and _put(c, 1)  # published, but its line could not be written
        assert (c.lookup(PATH, 1, SHAPES, np.float32)[0] == 1).all()  # this run still has it mapped
        assert not c.persisting and len(_full_warnings(caplog)) == 1
        (segment,) = (tmp_path / SHARED_DIR).glob("*.jsonl")
        assert segment.read_bytes().endswith(b"}\n")  # the torn part was cut off again
        assert not list((tmp_path / SHARED_DIR).glob("*.claim"))
    monkeypatch.undo()
    with _writer(tmp_path) as c:  # alone: the unlogged file is deleted, never revived
        assert set(c.entries()) == {(PATH, 0)} and c.dropped == {}
        assert not (tmp_path / persisted_basename(PATH, 1, FP)).exists()
        assert c.lookup(PATH, 1, SHAPES, np.float32) is None


def test_spill_falls_back_to_memory_on_a_full_disk(tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "posix_fallocate", FullAfter(2))
    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(tmp_path, persist=False) as c:
        assert _put(c, 0) and _put(c, 1) and not _put(c, 2) and not _put(c, 3)
        assert c.refused == {"full": 2}
    (warning,) = _full_warnings(caplog)
    assert "in memory" in warning and "cache_budget_bytes" in warning
    assert not list(tmp_path.glob("*.npy")) and not list(tmp_path.glob(".*.tmp"))


@needs_mount
def test_a_writer_opening_on_a_full_filesystem_still_runs(small_disk: Path, caplog) -> None:
    d = small_disk
    written = _fill(d, caplog)
    fd = os.open(d / "ballast", os.O_WRONLY | os.O_CREAT)  # take the last free pages too
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="insitubatch"), _writer(d) as c:
        assert not c.persisting  # its log segment could not even take its header
        assert (c.lookup(PATH, written[0], SHAPES, np.float32)[0] == written[0]).all()
        assert not _put(c, 50)
    assert len(_full_warnings(caplog)) == 1
