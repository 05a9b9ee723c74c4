"""CacheIndex: what the logs say as one cache knows it — its own lines at once, the others' on refresh."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from insitubatch.cache import SHARED_DIR, CacheOptions, LogEntry, persisted_basename
from insitubatch.cache.files import new_writer_token
from insitubatch.cache.index import CacheIndex
from insitubatch.cache.lock import release_fds
from insitubatch.cache.space import DiskSpace

FP_A, FP_B = "0123456789abcdef", "fedcba9876543210"
PATH = "t2m"


@contextmanager
def _opened(d: Path, *, fingerprint: str = FP_A, readonly: bool = False) -> Iterator[CacheIndex]:
    """An index admitted over ``d`` as a writer (or a readonly reader), closed on exit."""
    options = CacheOptions(d, persist=True, readonly=readonly)
    fds: list[int] = []
    index = CacheIndex(options, {PATH: fingerprint}, space=DiskSpace(d, persist=True, writes=not readonly), fds=fds)
    try:
        if readonly:
            index.open_as_reader()
        else:
            d.mkdir(exist_ok=True)
            index.open_as_writer(new_writer_token())
        yield index
    finally:
        index.close()
        release_fds(fds)


def _entry(chunk: int, fingerprint: str = FP_A, nbytes: int = 1000) -> LogEntry:
    name = persisted_basename(PATH, chunk, fingerprint)
    return LogEntry(PATH, chunk, name, ((4, 5),), np.dtype("<f4"), fingerprint, nbytes, 0, time.time_ns())


def _segment_lines(d: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) - 1 for p in (d / SHARED_DIR).glob("*.jsonl"))


def test_own_lines_at_once_the_others_on_refresh(tmp_path: Path) -> None:
    with _opened(tmp_path) as a, _opened(tmp_path) as b:
        first = _entry(0)
        a.log(first)
        assert a.entry(first.key) == first and a.made_here(first) and len(a) == 1
        assert b.entry(first.key) is None  # not looked yet
        b.refresh()
        assert b.entry(first.key) == first and not b.made_here(first)
        second = _entry(1, nbytes=500)
        a.log(second)
        b.refresh(every=3600.0)  # looked a moment ago: not again within the window
        assert b.entry(second.key) is None
        b.refresh()
        assert b.entry(second.key) == second
        assert b.logged_bytes() == 1500 and b.logged_bytes(besides=second.file) == 1000
        assert b.entries() == {first.key: first, second.key: second}


def test_a_line_the_log_holds_already_is_not_appended_again(tmp_path: Path) -> None:
    with _opened(tmp_path) as a:
        first = _entry(0)
        a.log(first)
        a.log(dataclasses.replace(first, t=first.t + 1))  # the same chunk, file and bytes, committed again
        assert _segment_lines(tmp_path) == 1 and a.entry(first.key) == first
        changed = dataclasses.replace(first, crc32c=7, t=first.t + 2)
        a.log(changed)
        assert _segment_lines(tmp_path) == 2 and a.entry(first.key) == changed and a.made_here(changed)


def test_other_transforms_lines_are_not_entries_but_their_bytes_count(tmp_path: Path) -> None:
    with _opened(tmp_path) as mine, _opened(tmp_path, fingerprint=FP_B) as other:
        theirs = _entry(0, FP_B, nbytes=300)
        other.log(theirs)
        mine.refresh()
        assert mine.entry(theirs.key) is None and mine.logged_bytes() == 300


def test_a_readonly_index_loads_what_the_writers_left(tmp_path: Path) -> None:
    with _opened(tmp_path) as a:
        a.log(_entry(0))
        a.log(_entry(1))
    with _opened(tmp_path, readonly=True) as reader:
        assert sorted(reader.entries()) == [(PATH, 0), (PATH, 1)] and reader.dropped == {} and len(reader) == 2
