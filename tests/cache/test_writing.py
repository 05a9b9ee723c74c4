"""CacheWriter: a chunk's file is in place before its line is logged; a refused or aborted write leaves nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from insitubatch.cache import SHARED_DIR, CacheOptions, persisted_basename
from insitubatch.cache.index import CacheIndex
from insitubatch.cache.tilefile import tile_file_nbytes

FP = "0123456789abcdef"
PATH = "t2m"
STORED = (4, 5, 4)
SHAPES = [(4, 5, 4), (4, 5, 3)]
CHUNK_BYTES = tile_file_nbytes(2, STORED, np.float32)


def _tiles(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _left_over(d: Path) -> list[str]:
    """Temporary files and claims: what a write in progress holds."""
    shared = d / SHARED_DIR
    claims = [p.name for p in shared.glob("*.claim")] if shared.is_dir() else []
    return sorted([p.name for p in d.glob(".*.tmp")] + claims)


@pytest.mark.invariant
def test_the_file_is_in_place_before_its_line_is_logged(
    tmp_path: Path, cache_parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed between the two leaves an unlogged file (deleted by a later lone writer), never a line
    naming a file that is not there."""
    seen: list[tuple[bool, list[str]]] = []
    real_log = CacheIndex.log

    def log(index, entry):
        seen.append(((tmp_path / entry.file).exists(), sorted(p.name for p in tmp_path.glob(".*.tmp"))))
        real_log(index, entry)

    monkeypatch.setattr(CacheIndex, "log", log)
    parts = cache_parts(CacheOptions(tmp_path, persist=True), {PATH: FP})
    handle = parts.writer.begin(PATH, 0, 2, STORED, np.float32)
    tiles = _tiles()
    for i, t in enumerate(tiles):
        parts.writer.write(handle, i, t)
    assert seen == [] and parts.writer.pending_bytes == 2 * int(np.prod(STORED)) * 4  # tiles, not the header
    views = parts.writer.commit(handle, SHAPES)
    assert seen == [(True, [])]  # published under its final name, no temporary left, then logged
    assert parts.index.entry((PATH, 0)).file == persisted_basename(PATH, 0, FP)
    assert _left_over(tmp_path) == [] and parts.writer.written == 1 and parts.writer.pending_bytes == 0
    assert parts.held.get((PATH, 0)) is not None  # a committed chunk is held
    for v, t in zip(views, tiles):
        np.testing.assert_array_equal(v, t)


def test_over_the_disk_budget_begin_declines_and_keeps_no_claim(tmp_path: Path, cache_parts) -> None:
    parts = cache_parts(CacheOptions(tmp_path, persist=True, disk_bytes=CHUNK_BYTES + 1), {PATH: FP})
    first = parts.writer.begin(PATH, 0, 2, STORED, np.float32)
    assert first is not None and not parts.space.over_budget
    assert parts.writer.begin(PATH, 1, 2, STORED, np.float32) is None  # the write in progress counts
    assert parts.space.over_budget and parts.space.refused == {"budget": 1}
    assert _left_over(tmp_path) == sorted([first.tile_file.file_path.name, f"{first.tile_file.path.stem}.claim"])


def test_an_aborted_write_leaves_nothing_and_cannot_be_committed(tmp_path: Path, cache_parts) -> None:
    parts = cache_parts(CacheOptions(tmp_path, persist=True), {PATH: FP})
    handle = parts.writer.begin(PATH, 0, 2, STORED, np.float32)
    assert _left_over(tmp_path) != [] and parts.writer.pending_bytes > 0
    parts.writer.abort(handle)
    parts.writer.abort(handle)  # idempotent
    assert _left_over(tmp_path) == [] and parts.writer.pending_bytes == 0 and parts.index.entry((PATH, 0)) is None
    with pytest.raises(ValueError, match="array 't2m' chunk 0 was already committed or aborted"):
        parts.writer.commit(handle, SHAPES)
    assert parts.writer.begin(PATH, 0, 2, STORED, np.float32) is not None  # its claim was let go
