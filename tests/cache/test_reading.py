"""CacheReader: revives logged chunks, refuses a damaged file once, and trusts the checksum its writer took."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from insitubatch.cache import CacheOptions, persisted_basename, reading
from insitubatch.errors import CacheCorruptError

FP = "0123456789abcdef"
PATH = "t2m"
STORED = (4, 5, 4)
SHAPES = [(4, 5, 4), (4, 5, 3)]


def _tiles(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _commit(parts, chunk: int, tiles: list[np.ndarray]) -> list[np.ndarray]:
    handle = parts.writer.begin(PATH, chunk, len(tiles), STORED, np.float32)
    for i, t in enumerate(tiles):
        parts.writer.write(handle, i, t)
    return parts.writer.commit(handle, SHAPES)


def _count_opens(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record the ``checksum`` flag of every file the reader maps alone."""
    calls: list[bool] = []
    real = reading.open_tile_file

    def counted(path, *, checksum=False):
        calls.append(checksum)
        return real(path, checksum=checksum)

    monkeypatch.setattr(reading, "open_tile_file", counted)
    return calls


@pytest.mark.invariant
def test_a_readonly_reader_revives_without_a_writer_and_refuses_a_damaged_file_once(
    tmp_path: Path, cache_parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing = cache_parts(CacheOptions(tmp_path, persist=True), {PATH: FP})
    good, bad = _tiles(0), _tiles(1)
    _commit(writing, 0, good)
    _commit(writing, 1, bad)
    writing.close()
    damaged = tmp_path / persisted_basename(PATH, 1, FP)
    with open(damaged, "r+b") as f:  # one payload byte flipped: the size and header still look right
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))

    parts = cache_parts(CacheOptions(tmp_path, persist=True, readonly=True), {PATH: FP})
    assert parts.writer is None
    found = parts.reader.find(PATH, 0, SHAPES, np.float32)
    assert found.from_other and not found.claimed
    for v, t in zip(found.tiles, good):
        np.testing.assert_array_equal(v, t)
    opens = _count_opens(monkeypatch)
    missed = parts.reader.find(PATH, 1, SHAPES, np.float32)  # claim=True: a readonly reader never claims
    assert missed.tiles is None and not missed.claimed and not missed.busy
    assert parts.reader.rejected == {"checksum": 1} and opens == [True]
    assert damaged.exists()  # a readonly reader writes nothing, deletes nothing
    assert "its CRC-32C is" in str(parts.reader.miss_error(PATH, 1))
    assert parts.reader.find(PATH, 1, SHAPES, np.float32).tiles is None
    assert opens == [True] and parts.reader.rejected == {"checksum": 1}  # turned away once: not mapped again

    strict = cache_parts(CacheOptions(tmp_path, persist=True, readonly=True, on_corrupt="raise"), {PATH: FP})
    with pytest.raises(CacheCorruptError, match=f"cache tile file {damaged} .* is damaged: its CRC-32C"):
        strict.reader.find(PATH, 1, SHAPES, np.float32)


def test_a_file_its_writer_checksummed_is_revived_without_summing_it_again(
    tmp_path: Path, cache_parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = cache_parts(CacheOptions(tmp_path, persist=True), {PATH: FP})
    tiles = _tiles(2)
    _commit(parts, 0, tiles)
    parts.held.evict((PATH, 0))  # the pool let it go: the next find maps the file again
    opens = _count_opens(monkeypatch)
    found = parts.reader.find(PATH, 0, SHAPES, np.float32)
    assert opens == [False] and not found.from_other and parts.reader.revived == 1
    for v, t in zip(found.tiles, tiles):
        np.testing.assert_array_equal(v, t)
    # another writer of the same directory never saw this file made: it sums it on first touch
    other = cache_parts(CacheOptions(tmp_path, persist=True), {PATH: FP})
    found = other.reader.find(PATH, 0, SHAPES, np.float32)
    assert opens == [False, True] and found.from_other and other.reader.revived_from_others == 1
