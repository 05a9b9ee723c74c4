"""HeldChunks: the mappings a cache holds; spill files are its own to delete, views outlive every release."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from insitubatch.cache.held import HeldChunks
from insitubatch.cache.tilefile import TileFile, create_tile_file, open_tile_file, write_tile

SHAPES = ((3, 4), (3, 2))  # one full tile and one packed edge tile of a (3, 4) stored tile
KEY = ("t2m", 0)


def _tile_file(path: Path, seed: int = 0) -> tuple[TileFile, list[np.ndarray]]:
    """A published tile file at ``path`` holding two tiles, opened read-only, and the tiles."""
    rng = np.random.default_rng(seed)
    tiles = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    with create_tile_file(path, len(tiles), (3, 4), np.float32, temp=True) as f:
        for i, t in enumerate(tiles):
            write_tile(f, i, t)
        f.publish()
    return open_tile_file(path), tiles


def _is_mapped(path: Path) -> bool:
    """Whether this process maps ``path`` (an unlinked file's line ends in " (deleted)")."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return any(line.rstrip().removesuffix(" (deleted)").endswith(str(path)) for line in maps)


def test_a_spill_file_goes_on_evict_a_persisted_one_stays(tmp_path: Path) -> None:
    held = HeldChunks(tmp_path)
    spill, tiles = _tile_file(tmp_path / "spill.npy")
    kept, _ = _tile_file(tmp_path / "kept.npy", seed=1)
    views = held.hold(KEY, spill, SHAPES, spill=True).views()
    held.hold(("t2m", 1), kept, SHAPES, spill=False)
    assert len(held) == 2 and held.nbytes == 2 * 2 * 3 * 4 * 4
    held.evict(KEY)
    held.evict(("t2m", 1))
    held.evict(("t2m", 9))  # never held: a no-op
    assert not (tmp_path / "spill.npy").exists() and (tmp_path / "kept.npy").exists()
    assert len(held) == 0 and held.nbytes == 0 and held.get(KEY) is None
    for v, t in zip(views, tiles):  # the caller's views keep the unlinked file's bytes mapped
        np.testing.assert_array_equal(v, t)
    assert _is_mapped(tmp_path / "spill.npy")  # ... until they die
    del views, v
    assert not _is_mapped(tmp_path / "spill.npy") and not _is_mapped(tmp_path / "kept.npy")


def test_holding_a_chunk_again_releases_the_older_mapping(tmp_path: Path) -> None:
    held = HeldChunks(tmp_path)
    old, _ = _tile_file(tmp_path / "a.npy")
    new, tiles = _tile_file(tmp_path / "b.npy", seed=2)
    held.hold(KEY, old, SHAPES, spill=False)
    got = held.hold(KEY, new, SHAPES, spill=False)
    assert old.closed and not new.closed and held.get(KEY) is got and len(held) == 1
    for v, t in zip(got.views(), tiles):
        assert v.shape == t.shape and not v.flags.writeable
        np.testing.assert_array_equal(v, t)


def test_closed_holds_nothing_and_takes_nothing(tmp_path: Path) -> None:
    held = HeldChunks(tmp_path)
    spill, _ = _tile_file(tmp_path / "spill.npy")
    held.hold(KEY, spill, SHAPES, spill=True)
    held.check_open()
    held.close()
    held.close()  # idempotent
    assert held.closed and len(held) == 0 and spill.closed and not (tmp_path / "spill.npy").exists()
    with pytest.raises(ValueError, match=f"DiskCache over '{tmp_path}' is closed"):
        held.check_open()
