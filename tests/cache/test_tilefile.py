"""Tile-major ``.npy`` tile files (cache.tilefile): header, packed edge tiles, zero-copy views, clean closing."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import numpy as np
import pytest

import insitubatch._ext.persist as _persist
from insitubatch.cache.tilefile import create_tile_file, open_tile_file, tile_file_nbytes, tile_view, write_tile
from insitubatch.errors import CacheCorruptError


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps", encoding="utf-8") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


@pytest.mark.parametrize("dtype", ["u1", "<i2", ">f8", "c8", "bool", "M8[s]", [("a", "u1"), ("b", "<f4")]], ids=str)
@pytest.mark.parametrize("tile_shape", [(3,), (2, 5), (4, 3, 2), (1, 2, 1, 3, 1)])
def test_numpy_reads_back_what_write_tile_wrote(tmp_path: Path, dtype: object, tile_shape: tuple) -> None:
    rng = np.random.default_rng(len(tile_shape))
    path = tmp_path / "tiles.npy"
    n_tiles = 4
    tiles = [
        rng.integers(0, 2 if np.dtype(dtype) == np.bool_ else 200, size=(*tile_shape, np.dtype(dtype).itemsize))
        .astype(np.uint8)
        .view(dtype)
        .reshape(tile_shape)
        for _ in range(n_tiles)
    ]
    with create_tile_file(path, n_tiles, tile_shape, dtype) as tiles_file:
        for i in rng.permutation(n_tiles):
            view = write_tile(tiles_file, i, tiles[i])
            assert view.flags.c_contiguous and view.shape == tile_shape
            assert np.shares_memory(view, tiles_file.tiles())
    header = path.read_bytes()[:256]
    header_len = 10 + int.from_bytes(header[8:10], "little")
    assert header_len % 64 == 0
    loaded = np.load(path, mmap_mode="r")
    assert loaded.shape == (n_tiles, *tile_shape) and loaded.dtype == np.dtype(dtype)
    for i in range(n_tiles):
        assert loaded[i].tobytes() == tiles[i].tobytes()
    del loaded


def test_edge_tiles_are_stored_packed_and_viewed_by_shape(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    full = rng.random((2, 181, 360), dtype=np.float32)
    edge = rng.random((2, 178, 360), dtype=np.float32)  # bottom row of a 4x4-tiled 721x1440 field
    corner = rng.random((1, 178, 7), dtype=np.float32)  # and a final partial chunk on top
    with create_tile_file(tmp_path / "c.npy", 3, full.shape, "f4") as tiles_file:
        for i, tile in enumerate((full, edge, corner)):
            view = write_tile(tiles_file, i, tile)
            np.testing.assert_array_equal(view, tile)
            assert view.flags.c_contiguous
        np.testing.assert_array_equal(tile_view(tiles_file, 1, edge.shape), edge)
        raw = tiles_file.tiles()[2].reshape(-1)
        np.testing.assert_array_equal(raw[: corner.size], corner.reshape(-1))
        assert not raw[corner.size :].any()  # the rest of the position is untouched zeros
        del raw


def test_reopened_file_gives_read_only_zero_copy_views(tmp_path: Path) -> None:
    path = tmp_path / "r.npy"
    tile = np.arange(24, dtype="<u2").reshape(2, 3, 4)
    with create_tile_file(path, 2, (2, 3, 4), "<u2") as tiles_file:
        write_tile(tiles_file, 1, np.ascontiguousarray(tile[:, :2]))
    with open_tile_file(path) as tiles_file:
        assert (tiles_file.n_tiles, tiles_file.tile_shape, tiles_file.dtype) == (2, (2, 3, 4), np.dtype("<u2"))
        view = tile_view(tiles_file, 1, (2, 2, 4))
        np.testing.assert_array_equal(view, tile[:, :2])
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="opened read-only"):
            write_tile(tiles_file, 0, tile)
        del view
    with open_tile_file(path, writable=True) as tiles_file:
        write_tile(tiles_file, 0, tile)
    np.testing.assert_array_equal(np.load(path)[0], tile)


def test_temp_file_is_published_by_rename_or_removed_on_close(tmp_path: Path) -> None:
    path = tmp_path / "chunk.npy"
    tile = np.ones((4,), "f8")
    tiles_file = create_tile_file(path, 1, (4,), "f8", temp=True)
    write_tile(tiles_file, 0, tile)
    assert not path.exists() and tiles_file.file_path.exists() and tiles_file.file_path.parent == tmp_path
    assert tiles_file.publish() == path and tiles_file.file_path == path
    tiles_file.close()
    np.testing.assert_array_equal(np.load(path)[0], tile)

    # a reader of the published file keeps its bytes when a new version replaces it
    reader = open_tile_file(path)
    old = tile_view(reader, 0)
    with create_tile_file(path, 1, (4,), "f8", temp=True) as newer:
        write_tile(newer, 0, tile * 2)
        newer.publish()
    np.testing.assert_array_equal(old, tile)
    np.testing.assert_array_equal(np.load(path)[0], tile * 2)
    del old
    reader.close()

    abandoned = create_tile_file(path, 1, (4,), "f8", temp=True)
    temp = abandoned.file_path
    abandoned.close()
    assert not temp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk.npy"]


def test_close_unmaps_now_or_when_the_last_view_dies(tmp_path: Path) -> None:
    path = tmp_path / "m.npy"
    fds = _fds()
    tiles_file = create_tile_file(path, 2, (8,), "i4")
    assert _fds() == fds  # the descriptor is closed once the file is mapped
    view = write_tile(tiles_file, 0, np.arange(8, dtype="i4"))
    assert _mapped(path)
    tiles_file.close()
    assert tiles_file.closed and _mapped(path)  # a live view keeps the bytes mapped
    np.testing.assert_array_equal(view, np.arange(8))
    del view
    assert not _mapped(path)
    tiles_file.close()  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        tile_view(tiles_file, 0)
    with pytest.raises(ValueError, match="is closed"):
        write_tile(tiles_file, 0, np.zeros(8, "i4"))

    for _ in range(50):
        with create_tile_file(path, 1, (8,), "i4") as tiles_file:
            write_tile(tiles_file, 0, np.zeros(8, "i4"))
    assert _fds() == fds and not _mapped(path)


def test_empty_tile_file(tmp_path: Path) -> None:
    path = tmp_path / "e.npy"
    with create_tile_file(path, 0, (3, 2), "f4") as tiles_file:
        assert tiles_file.tiles().shape == (0, 3, 2)
    assert np.load(path).shape == (0, 3, 2)
    with create_tile_file(path, 2, (0, 2), "f4") as tiles_file:
        assert write_tile(tiles_file, 1, np.zeros((0, 2), "f4")).shape == (0, 2)


@pytest.mark.parametrize(
    ("index", "tile", "match"),
    [
        (0, np.zeros((3, 5), "f4"), r"tile shape \(3, 5\) does not fit the tile shape \(2, 4\)"),
        (0, np.zeros((2,), "f4"), r"tile shape \(2,\) does not fit"),
        (0, np.zeros((2, 4), "f8"), "tile dtype float64 does not match the tile file's dtype float32"),
        (2, np.zeros((2, 4), "f4"), r"tile_index=2 is outside \[0, 2\)"),
        (-1, np.zeros((2, 4), "f4"), r"tile_index=-1 is outside"),
        (0, np.zeros((2, 8), "f4")[:, ::2], "tile must be C-contiguous"),
    ],
)
def test_write_tile_names_what_does_not_fit(tmp_path: Path, index: int, tile: np.ndarray, match: str) -> None:
    with create_tile_file(tmp_path / "x.npy", 2, (2, 4), "f4") as tiles_file:
        with pytest.raises(ValueError, match=match):
            write_tile(tiles_file, index, tile)


def test_damaged_files_raise_cache_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "d.npy"
    with create_tile_file(path, 2, (4,), "f4"):
        pass
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    with pytest.raises(CacheCorruptError, match="bytes but its header"):
        open_tile_file(path)
    path.write_bytes(b"not a numpy file at all")
    with pytest.raises(CacheCorruptError, match="not a readable .npy"):
        open_tile_file(path)
    np.save(path, np.zeros((2, 3), order="F"))
    with pytest.raises(CacheCorruptError, match="fortran_order=True"):
        open_tile_file(path)
    with pytest.raises(ValueError, match="only fixed-size dtypes"):
        create_tile_file(tmp_path / "o.npy", 1, (2,), object)


def test_checksum_covers_the_whole_file_and_a_temp_tag_names_its_writer(tmp_path: Path) -> None:
    path = tmp_path / "tiles.npy"
    with create_tile_file(path, 2, (3, 4), "f4", temp="0123456789abcdef-7") as f:
        assert f.file_path.name == ".tiles.npy.0123456789abcdef-7.tmp"
        write_tile(f, 0, np.ones((3, 4), "f4"))
        write_tile(f, 1, np.full((2, 4), 2.0, "f4"))  # an edge tile
        crc = f.checksum()
        assert f.nbytes == tile_file_nbytes(2, (3, 4), "f4") == f.file_path.stat().st_size
        f.publish()
    assert crc == crc32c.crc32c(path.read_bytes())
    with open_tile_file(path) as g:
        st = path.stat()
        assert g.checksum() == crc and g.identity == (st.st_ino, st.st_size, st.st_mtime_ns)


@pytest.mark.parametrize("offset", range(8))
def test_the_crc32c_kernel_equals_the_crc32c_package(offset: int) -> None:
    """Every length around the kernel's 8-byte words and three-lane rounds, at every alignment, and chained."""
    rng = np.random.default_rng(offset)
    blob = rng.integers(0, 256, 3 * 512 * 4 + 64, dtype=np.uint8).tobytes()
    lengths = [0, 1, 7, 8, 9, 511, 512, 1535, 1536, 1537, 3071, 3072, 3073, 4 * 1536 + 13]
    for n in lengths:
        data = blob[offset : offset + n]
        assert _persist.crc32c(data) == crc32c.crc32c(data), n
        assert _persist.crc32c(data, 0xDEADBEEF) == crc32c.crc32c(data, 0xDEADBEEF), n
    head, tail = blob[:1000], blob[1000:]
    assert _persist.crc32c(tail, _persist.crc32c(head)) == crc32c.crc32c(blob)


def test_open_with_checksum_maps_and_sums_in_one_call(tmp_path: Path) -> None:
    path = tmp_path / "tiles.npy"
    with create_tile_file(path, 3, (5, 7), "<f8") as f:
        for i in range(3):
            write_tile(f, i, np.full((5, 7), i + 0.5))
    fds = _fds()
    with open_tile_file(path, checksum=True) as g:
        assert _fds() == fds  # the descriptor is closed once the file is mapped
        assert g.crc_at_open == crc32c.crc32c(path.read_bytes()) == g.checksum()
        np.testing.assert_array_equal(tile_view(g, 2), np.full((5, 7), 2.5))
    assert not _mapped(path)
    with open_tile_file(path) as g:
        assert g.crc_at_open is None
    with pytest.raises(FileNotFoundError):
        open_tile_file(tmp_path / "missing.npy", checksum=True)
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(CacheCorruptError, match="empty"):
        open_tile_file(tmp_path / "empty.npy", checksum=True)
