"""The tile-major ``.npy`` file format of the disk cache: one chunk's tiles, each at its position.

A file holds ``(n_tiles, *tile_shape)`` elements behind a standard ``.npy``
header, so ``numpy.load(path, mmap_mode="r")`` opens it; tile ``i`` of a chunk
lives at position ``i``. ``create_tile_file`` / ``open_tile_file`` map a file,
``write_tile`` copies a decoded tile in with the GIL released and
``tile_view`` returns the zero-copy view the gather kernel reads;
``TileFile.checksum`` is the CRC-32C of the whole file, header included,
computed over the mapping with the GIL released.
"""

from __future__ import annotations

import errno
import math
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import numpy.typing as npt

import insitubatch._ext.persist as _persist

from ..errors import CacheCorruptError

__all__ = [
    "TileFile",
    "create_tile_file",
    "open_tile_file",
    "open_tile_files",
    "tile_file_nbytes",
    "tile_view",
    "write_tile",
]


_NPY_MAGIC = b"\x93NUMPY"
# numpy pads a .npy header so the data starts on this boundary (numpy.lib.format.ARRAY_ALIGN)
_NPY_ALIGN = 64


def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """A complete ``.npy`` header (format 1.0, or 2.0 when it outgrows 64 KiB) for C order."""
    descr = dtype.str if dtype.names is None else dtype.descr
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    for version, len_bytes in ((b"\x01\x00", 2), (b"\x02\x00", 4)):
        prefix = len(_NPY_MAGIC) + len(version) + len_bytes
        body_len = len(text) + 1  # the header ends with a newline
        body_len += -(prefix + body_len) % _NPY_ALIGN
        if body_len < 1 << (8 * len_bytes):
            body = text.ljust(body_len - 1) + "\n"
            return _NPY_MAGIC + version + body_len.to_bytes(len_bytes, "little") + body.encode("latin1")
    raise ValueError(f"a .npy header for shape {shape} and dtype {dtype} is too long")


# a version-1 header is at most this long (its length field is two bytes)
_OWN_HEADER_MAX = 10 + 0xFFFF
_OWN_HEADER = re.compile(
    rb"\{'descr': '([<>|=]?[a-zA-Z][0-9]*)', 'fortran_order': False, 'shape': \(([0-9, ]*)\), \} *\n"
)


def _parse_own_header(head: bytes | memoryview) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """Parse a version-1 header exactly as ``_npy_header`` writes it (reviving is per chunk: keep it cheap)."""
    if len(head) < 10 or bytes(head[:8]) != _NPY_MAGIC + b"\x01\x00":
        return None
    length = int.from_bytes(head[8:10], "little")
    match = _OWN_HEADER.fullmatch(bytes(head[10 : 10 + length]))
    if match is None:
        return None
    shape = tuple(int(x) for x in match.group(2).split(b",") if x.strip())
    return shape, False, np.dtype(match.group(1).decode("ascii")), 10 + length


def _parse_any_header(f, path: Path) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Any header numpy reads (a file not in ``_npy_header``'s exact form), from the start of ``f``."""
    f.seek(0)
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        return (*read(f), f.tell())
    except ValueError as exc:
        raise CacheCorruptError(f"{path} is not a readable .npy tile file: {exc}") from exc


def _check_header(path: Path, parsed: tuple[tuple[int, ...], bool, np.dtype, int], size: int) -> None:
    """A tile file's header must be C order, at least one dim, and agree with the file's size."""
    shape, fortran_order, dtype, header_bytes = parsed
    if fortran_order or len(shape) == 0 or dtype.hasobject:
        raise CacheCorruptError(
            f"{path} holds shape {shape}, dtype {dtype}, fortran_order={fortran_order}; not a tile file"
        )
    expected = header_bytes + math.prod(shape) * dtype.itemsize
    if size != expected:
        raise CacheCorruptError(f"{path} is {size} bytes but its header {shape} {dtype} says {expected}")


class TileFile:
    """A tile-major ``.npy`` file of shape ``(n_tiles, *tile_shape)``, mapped shared.

    Tile ``i`` of a chunk lives at position ``i``, contiguous. An edge tile,
    smaller than ``tile_shape``, is stored *packed*: its own C-order bytes at the
    start of its position, the rest of the position unused (zero). Reading it back therefore
    needs its shape — ``tile_view(f, i, shape)`` returns the C-contiguous view
    that ``gather`` takes, exactly like a freshly decoded tile. The file is a
    valid ``.npy``: ``numpy.load(path, mmap_mode="r")`` opens it (an edge
    position's raw bytes then read as the packed tile, not as a padded rectangle).

    Build one with ``create_tile_file`` or ``open_tile_file``; ``close()``
    unmaps (deferred until the last view returned by ``write_tile`` /
    ``tile_view`` dies). The object is also a context manager.
    """

    def __init__(
        self,
        path: Path,
        file_path: Path,
        mapping: _persist.FileMapping,
        header_bytes: int,
        n_tiles: int,
        tile_shape: tuple[int, ...],
        dtype: np.dtype,
        identity: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        self.path = path
        self.n_tiles = n_tiles
        self.tile_shape = tile_shape
        self.dtype = dtype
        self.tile_bytes = math.prod(tile_shape) * dtype.itemsize
        # (inode, size, mtime ns) when opened: tells this file from a later one under the same name
        self.identity = identity
        self._file_path = file_path
        self._mapping = mapping
        self._header_bytes = header_bytes
        self.crc_at_open: int | None = None  # the file's CRC-32C when open_tile_file(checksum=True) mapped it

    @property
    def file_path(self) -> Path:
        """Where the bytes are now: a temporary name next to ``path`` until ``publish()``."""
        return self._file_path

    @property
    def writable(self) -> bool:
        return self._mapping.writable

    @property
    def closed(self) -> bool:
        return self._mapping.closed

    def tiles(self) -> np.ndarray:
        """A view of every position, ``(n_tiles, *tile_shape)`` (edge positions hold packed bytes)."""
        count = self.n_tiles * math.prod(self.tile_shape)
        flat = np.frombuffer(memoryview(self._mapping), self.dtype, count, self._header_bytes)
        return flat.reshape((self.n_tiles, *self.tile_shape))

    @property
    def header_bytes(self) -> int:
        """Bytes of the ``.npy`` header, before tile position 0."""
        return self._header_bytes

    @property
    def nbytes(self) -> int:
        """The file's size: header and every tile position."""
        return self._header_bytes + self.n_tiles * self.tile_bytes

    def view_at(self, offset: int, shape: tuple[int, ...]) -> np.ndarray:
        """The zero-copy view of ``shape`` starting at byte ``offset`` (``tile_view`` checks both)."""
        # the memoryview is the export that keeps the mapping alive (and mapped) under the view
        flat = np.frombuffer(memoryview(self._mapping), self.dtype, math.prod(shape), offset)
        return flat.reshape(shape)

    def copy_at(self, offset: int, tile: np.ndarray) -> int:
        """Copy ``tile``'s bytes to byte ``offset`` with the GIL released (``write_tile`` checks both); 0 when done."""
        return self._mapping.write(offset, tile)

    def checksum(self) -> int:
        """The CRC-32C of the whole file (header and payload), read through the mapping with the GIL released."""
        return self._mapping.crc32c()

    def publish(self) -> Path:
        """Rename the temporary file to ``path`` atomically (replacing any file there).

        A mapping another process already holds of an older file keeps its inode
        and its bytes. No-op when the file was created in place.
        """
        if self._file_path != self.path:
            os.replace(self._file_path, self.path)
            self._file_path = self.path
        return self.path

    def close(self) -> None:
        """Unmap the file; an unpublished temporary file is deleted. Idempotent."""
        self._mapping.close()
        if self._file_path != self.path:
            self._file_path.unlink(missing_ok=True)
            self._file_path = self.path

    def __enter__(self) -> TileFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("rw" if self.writable else "r")
        return f"TileFile({str(self.path)!r}, n_tiles={self.n_tiles}, tile_shape={self.tile_shape}, dtype={self.dtype}, {state})"


def _file_geometry(
    n_tiles: int, tile_shape: Sequence[int], dtype: npt.DTypeLike
) -> tuple[int, tuple[int, ...], np.dtype]:
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise ValueError(f"dtype {dt} cannot live in a tile file; only fixed-size dtypes can")
    n_tiles = int(n_tiles)
    shape = tuple(int(x) for x in tile_shape)
    if n_tiles < 0 or any(x < 0 for x in shape):
        raise ValueError(f"{n_tiles=} and tile_shape={shape} must be >= 0")
    return n_tiles, shape, dt


def tile_file_nbytes(n_tiles: int, tile_shape: Sequence[int], dtype: npt.DTypeLike) -> int:
    """The size of the tile file ``create_tile_file`` would make, header included."""
    n_tiles, tile_shape, dt = _file_geometry(n_tiles, tile_shape, dtype)
    return len(_npy_header((n_tiles, *tile_shape), dt)) + n_tiles * math.prod(tile_shape) * dt.itemsize


def create_tile_file(
    path: str | os.PathLike,
    n_tiles: int,
    tile_shape: Sequence[int],
    dtype: npt.DTypeLike,
    *,
    temp: bool | str = False,
) -> TileFile:
    """Create a writable tile file ``(n_tiles, *tile_shape)`` of ``dtype`` and map it.

    The file is sized with ``ftruncate`` and its blocks reserved with
    ``posix_fallocate`` where the platform has it, so a full disk fails here
    (``OSError`` ``ENOSPC``/``EDQUOT``, nothing left behind) rather than as a
    ``SIGBUS`` during a later ``write_tile``. With ``temp`` the bytes go to a
    temporary name next to ``path``, ``.<name>.<tag>.tmp`` (``temp=True``: a
    tag of the PID and random digits; a string: that tag, unique to its
    writer); ``publish()`` renames it into place and ``close()`` without
    ``publish()`` deletes it.
    """
    n_tiles, tile_shape, dtype = _file_geometry(n_tiles, tile_shape, dtype)
    path = Path(path)
    tag = temp if isinstance(temp, str) else f"{os.getpid()}-{secrets.token_hex(4)}"
    file_path = path.with_name(f".{path.name}.{tag}.tmp") if temp else path
    header = _npy_header((n_tiles, *tile_shape), dtype)
    total = len(header) + n_tiles * math.prod(tile_shape) * dtype.itemsize
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if temp else os.O_TRUNC)
    fd = os.open(file_path, flags, 0o644)
    try:
        os.pwrite(fd, header, 0)
        os.ftruncate(fd, total)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, total)
        mapping = _persist.FileMapping(fd, total, True)
    except BaseException:
        os.close(fd)
        file_path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return TileFile(path, file_path, mapping, len(header), n_tiles, tile_shape, dtype)


def open_tile_file(path: str | os.PathLike, *, writable: bool = False, checksum: bool = False) -> TileFile:
    """Map an existing tile file (revive a persisted chunk), read-only unless ``writable``.

    A read-only file is opened, sized and mapped in one kernel call without
    the GIL; with ``checksum`` that call also computes its CRC-32C
    (``TileFile.crc_at_open``), so verifying a revived file costs no second
    pass over the mapping nor another GIL hand-off.

    Raises
    ------
    CacheCorruptError
        When the header is not a C-order ``.npy`` header of at least one dim, or
        the file size disagrees with it (an empty file included).
    """
    path = Path(path)
    if writable:
        with open(path, "r+b") as f:
            parsed = _parse_own_header(f.read(_OWN_HEADER_MAX)) or _parse_any_header(f, path)
            st = os.fstat(f.fileno())
            _check_header(path, parsed, st.st_size)
            mapping = _persist.FileMapping(f.fileno(), st.st_size, True)
        shape, _, dtype, header_bytes = parsed
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        return TileFile(path, path, mapping, header_bytes, shape[0], tuple(shape[1:]), dtype, identity)
    (opened,) = open_tile_files([path], [checksum])
    if isinstance(opened, Exception):
        raise opened
    return opened


def open_tile_files(paths: Sequence[str | os.PathLike], checksums: Sequence[bool]) -> list[TileFile | Exception]:
    """``open_tile_file`` (read-only) for many files, mapped and checksummed in one kernel call without the GIL.

    One result per path, in order: its ``TileFile`` or the exception
    ``open_tile_file`` would have raised (``FileNotFoundError``,
    ``CacheCorruptError``, ...).
    """
    out: list[TileFile | Exception] = []
    for path, mapped in zip(paths, _persist.map_paths(paths, checksums)):
        path = Path(path)
        try:
            if isinstance(mapped, OSError):
                _raise_open_error(path, mapped)
            out.append(_adopt_mapping(path, *mapped))
        except Exception as exc:
            out.append(exc)
    return out


def _raise_open_error(path: Path, exc: OSError) -> NoReturn:
    """Raise what a failed ``map_paths`` entry means for a tile file: an empty file is a damaged one."""
    if exc.errno == errno.EINVAL and path.is_file():
        raise CacheCorruptError(f"{path} is empty: not a readable .npy tile file") from exc
    raise exc


def _adopt_mapping(
    path: Path, mapping: _persist.FileMapping, identity: tuple[int, int, int], crc: int | None
) -> TileFile:
    """The read-only ``TileFile`` over a file ``map_paths`` mapped: its header parsed and checked."""
    try:
        with memoryview(mapping) as whole:
            parsed = _parse_own_header(whole[:_OWN_HEADER_MAX])
        if parsed is None:  # not in the exact form _npy_header writes: let numpy judge it
            with open(path, "rb") as f:
                parsed = _parse_any_header(f, path)
        _check_header(path, parsed, identity[1])
    except BaseException:
        mapping.close()
        raise
    shape, _, dtype, header_bytes = parsed
    tile_file = TileFile(path, path, mapping, header_bytes, shape[0], tuple(shape[1:]), dtype, identity)
    tile_file.crc_at_open = crc
    return tile_file


def _tile_offset(tile_file: TileFile, tile_index: int, shape: Sequence[int]) -> int:
    if tile_file.closed:
        raise ValueError(f"{tile_file!r} is closed")
    i = int(tile_index)
    if not 0 <= i < tile_file.n_tiles:
        raise ValueError(f"tile_index={i} is outside [0, {tile_file.n_tiles}) of {tile_file.path}")
    if len(shape) != len(tile_file.tile_shape) or any(
        not 0 <= int(a) <= b for a, b in zip(shape, tile_file.tile_shape)
    ):
        raise ValueError(
            f"tile shape {tuple(shape)} does not fit the tile shape {tile_file.tile_shape} of {tile_file.path}"
        )
    return tile_file.header_bytes + i * tile_file.tile_bytes


def tile_view(tile_file: TileFile, tile_index: int, shape: Sequence[int] | None = None) -> np.ndarray:
    """The zero-copy C-contiguous view of tile ``tile_index`` (``shape`` for an edge tile)."""
    shape = tile_file.tile_shape if shape is None else tuple(int(x) for x in shape)
    return tile_file.view_at(_tile_offset(tile_file, tile_index, shape), shape)


def write_tile(tile_file: TileFile, tile_index: int, tile: np.ndarray) -> np.ndarray:
    """Copy a decoded ``tile`` into its position (GIL released) and return the zero-copy view of it.

    ``tile`` must be C-contiguous with the file's dtype and fit ``tile_shape``
    in every dim; an edge tile is stored packed (see ``TileFile``).
    """
    if not isinstance(tile, np.ndarray):
        raise TypeError(f"tile must be a numpy.ndarray, got {type(tile).__name__}")
    if not tile.flags.c_contiguous:
        raise ValueError(f"tile must be C-contiguous (got strides {tile.strides} for shape {tile.shape})")
    if tile.dtype != tile_file.dtype:
        raise ValueError(f"tile dtype {tile.dtype} does not match the tile file's dtype {tile_file.dtype}")
    if not tile_file.writable:
        raise ValueError(f"{tile_file!r} was opened read-only")
    offset = _tile_offset(tile_file, tile_index, tile.shape)
    status = tile_file.copy_at(offset, tile)
    if status:  # unreachable after the checks above; kept so a kernel refusal is never silent
        raise ValueError(f"write_tile refused the copy into {tile_file.path} (status {status})")
    return tile_file.view_at(offset, tile.shape)
