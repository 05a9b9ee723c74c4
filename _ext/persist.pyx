"""A shared file mapping that knows who still looks at it, the tile write into it, and CRC-32C.

``FileMapping`` maps a whole file ``MAP_SHARED`` and exports it through the
buffer protocol; ``insitubatch.kernels`` builds the tile-major ``.npy`` tile
file on top (header, sizing, views). ``close()`` unmaps at once when no view is
alive, else as soon as the last view is released — never under a live view.
``map_paths`` opens, maps and (optionally) checksums many files in one call
without the GIL: reviving a block of persisted chunks costs one GIL hand-off,
not one per syscall and per file.
"""

import os

cimport numpy as cnp
from bytebuf cimport export_bytes
from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport errno
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

# mmap/munmap on POSIX; elsewhere a mapping fails with ENOSYS (see the header)
cdef extern from "insitu_platform.h" nogil:
    void* insitu_map_file(int fd, size_t length, int writable)
    int insitu_unmap_file(void* base, size_t length)
    void* insitu_map_path(const char* path, size_t* length, long long* identity)

cdef extern from "insitu_crc32c.h" nogil:
    void insitu_crc32c_init()
    unsigned int insitu_crc32c(unsigned int crc, const void* p, size_t n)

cnp.import_array()
insitu_crc32c_init()

# only _adopt holds it: FileMapping(..., _token=_ADOPT) takes a mapping map_paths made
cdef object _ADOPT = object()


cdef class FileMapping:
    """``length`` bytes of the open file ``fd`` mapped shared; the fd may be closed after."""

    cdef char* base
    cdef Py_ssize_t length
    cdef Py_ssize_t stride        # 1: exported as a flat byte vector
    cdef readonly bint writable
    cdef readonly int exports
    cdef bint closing

    def __cinit__(self, int fd, Py_ssize_t length, bint writable, _token=None):
        cdef void* p
        cdef int err = 0
        self.base = NULL
        if _token is _ADOPT:
            return
        if length <= 0:
            raise ValueError(f"{length=} must be > 0 to map a file")
        with nogil:
            p = insitu_map_file(fd, <size_t>length, writable)
            if p == NULL:
                err = errno
        if p == NULL:
            raise OSError(err, f"mmap of {length} bytes failed")
        self.base = <char*>p
        self.length = length
        self.stride = 1
        self.writable = writable

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called (the bytes may stay mapped for live views)."""
        return self.base == NULL or self.closing

    @property
    def nbytes(self) -> int:
        return self.length

    @property
    def mapped(self) -> bool:
        """True while the file is mapped into this process."""
        return self.base != NULL

    def close(self):
        """Unmap now, or when the last live view is released. Idempotent."""
        self.closing = True
        if self.exports == 0:
            self._unmap()

    cdef void _unmap(self) noexcept:
        if self.base != NULL:
            with nogil:
                insitu_unmap_file(self.base, <size_t>self.length)
            self.base = NULL

    def crc32c(self) -> int:
        """The CRC-32C of every mapped byte, computed without the GIL."""
        cdef unsigned int crc
        if self.base == NULL or self.closing:
            raise ValueError("the file mapping is closed")
        with nogil:
            crc = insitu_crc32c(0, self.base, <size_t>self.length)
        return crc

    def write(self, Py_ssize_t offset, cnp.ndarray src):
        """Copy the C-contiguous ``src`` to byte ``offset`` without the GIL.

        Returns 0, -1 when the mapping is closed or read-only, -2 when the bytes
        would not fit, -3 when ``src`` is not C-contiguous.
        """
        cdef Py_ssize_t nbytes = cnp.PyArray_NBYTES(src)
        cdef const char* s = <const char*>cnp.PyArray_DATA(src)
        if self.base == NULL or self.closing or not self.writable:
            return -1
        if offset < 0 or nbytes > self.length - offset:
            return -2
        if not cnp.PyArray_IS_C_CONTIGUOUS(src):
            return -3
        with nogil:
            memcpy(self.base + offset, s, <size_t>nbytes)
        return 0

    def __getbuffer__(self, Py_buffer* buf, int flags):
        if self.base == NULL or self.closing:
            raise BufferError("the file mapping is closed")
        if (flags & PyBUF_WRITABLE) and not self.writable:
            raise BufferError("the file mapping is read-only")
        export_bytes(buf, self.base, &self.length, &self.stride, not self.writable, flags)
        buf.obj = self
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buf):
        self.exports -= 1
        if self.exports == 0 and self.closing:
            self._unmap()

    def __dealloc__(self):
        self._unmap()


cdef FileMapping _adopt(void* base, size_t length):
    cdef FileMapping mapping = FileMapping(-1, <Py_ssize_t>length, False, _ADOPT)
    mapping.base = <char*>base
    mapping.length = <Py_ssize_t>length
    mapping.stride = 1
    return mapping


cdef struct _PathMap:
    const char* path
    void* base              # NULL until mapped, and again once a FileMapping owns it
    size_t length
    long long identity[3]   # inode, size, mtime ns
    unsigned int crc
    int err
    bint checksum


def map_paths(paths, checksums):
    """Open, map read-only and close many files in one call without the GIL; one result per path, in order.

    Each result is ``(mapping, (inode, size, mtime_ns), crc)`` — ``crc`` the
    CRC-32C of the whole file where its ``checksums`` flag is set, else
    ``None`` — or the ``OSError`` that file raised (``FileNotFoundError``
    for a missing one; ``EINVAL`` for an empty one, which has nothing to
    map). The checksums run while other threads hold the GIL.
    """
    cdef list encoded = [os.fsencode(p) for p in paths]
    cdef Py_ssize_t n = len(encoded), i
    if len(checksums) != n:
        raise ValueError(f"{n} paths but {len(checksums)} checksum flags")
    if n == 0:
        return []
    cdef _PathMap* maps = <_PathMap*>calloc(n, sizeof(_PathMap))
    if maps == NULL:
        raise MemoryError()
    cdef list out = []
    try:
        for i in range(n):
            maps[i].path = <const char*>(<bytes>encoded[i])
            maps[i].checksum = bool(checksums[i])
        with nogil:
            for i in range(n):
                maps[i].base = insitu_map_path(maps[i].path, &maps[i].length, maps[i].identity)
                if maps[i].base == NULL:
                    maps[i].err = errno
                elif maps[i].checksum:
                    maps[i].crc = insitu_crc32c(0, maps[i].base, maps[i].length)
        for i in range(n):
            if maps[i].base == NULL:
                err = maps[i].err
                out.append(OSError(err, os.strerror(err), os.fsdecode(encoded[i])))
                continue
            mapping = _adopt(maps[i].base, maps[i].length)
            maps[i].base = NULL  # the mapping owns it now
            identity = (maps[i].identity[0], maps[i].identity[1], maps[i].identity[2])
            out.append((mapping, identity, maps[i].crc if maps[i].checksum else None))
    finally:
        for i in range(n):  # mapped but never adopted (an error building the results): unmap here
            if maps[i].base != NULL:
                insitu_unmap_file(maps[i].base, maps[i].length)
        free(maps)
    return out


def crc32c(data, unsigned int value=0) -> int:
    """The CRC-32C of a contiguous buffer, continuing ``value``; the crc32c package's value, without the GIL."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef unsigned int crc
    cdef size_t n = view.shape[0]
    with nogil:
        crc = insitu_crc32c(value, &view[0] if n else NULL, n)
    return crc
