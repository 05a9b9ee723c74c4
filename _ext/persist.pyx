"""A shared file mapping that knows who still looks at it, the tile write into it, and CRC-32C.

``FileMapping`` maps a whole file ``MAP_SHARED`` and exports it through the
buffer protocol; ``insitubatch.kernels`` builds the tile-major ``.npy`` tile
file on top (header, sizing, views). ``close()`` unmaps at once when no view is
alive, else as soon as the last view is released — never under a live view.
``map_path`` opens, maps and (optionally) checksums a file in one call without
the GIL: reviving a persisted chunk costs one GIL hand-off, not one per syscall.
"""

import os

cimport numpy as cnp
from bytebuf cimport export_bytes
from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport errno
from libc.stdlib cimport calloc, free, malloc
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

# only map_path holds it: FileMapping(..., _token=_ADOPT) takes a mapping made elsewhere
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


def map_path(path, bint checksum=False):
    """Open ``path``, map all of it read-only and close it, in one call without the GIL.

    Returns ``(mapping, (inode, size, mtime_ns), crc)``: ``crc`` is the
    CRC-32C of the whole file with ``checksum``, else ``None``. Raises
    ``OSError`` (``FileNotFoundError`` for a missing file; ``EINVAL`` for an
    empty one, which has nothing to map).
    """
    cdef bytes encoded = os.fsencode(path)
    cdef const char* c_path = encoded
    cdef size_t length = 0
    cdef long long identity[3]
    cdef void* base
    cdef unsigned int crc = 0
    cdef int err = 0
    with nogil:
        base = insitu_map_path(c_path, &length, identity)
        if base == NULL:
            err = errno
        elif checksum:
            crc = insitu_crc32c(0, base, length)
    if base == NULL:
        raise OSError(err, os.strerror(err), os.fsdecode(encoded))
    return _adopt(base, length), (identity[0], identity[1], identity[2]), (crc if checksum else None)


def map_paths(paths, checksums):
    """``map_path`` for many files in one call without the GIL: one result per path, in order.

    Each result is ``(mapping, identity, crc)`` as ``map_path`` returns it, or
    the ``OSError`` that file raised. Reviving a block of chunks thus costs one
    GIL hand-off in all, and their checksums run while other threads hold the GIL.
    """
    cdef list encoded = [os.fsencode(p) for p in paths]
    cdef Py_ssize_t n = len(encoded), i
    if len(checksums) != n:
        raise ValueError(f"{n} paths but {len(checksums)} checksum flags")
    if n == 0:
        return []
    cdef const char** c_paths = <const char**>malloc(n * sizeof(char*))
    cdef void** bases = <void**>calloc(n, sizeof(void*))  # NULL: nothing to unmap
    cdef size_t* lengths = <size_t*>malloc(n * sizeof(size_t))
    cdef long long* identities = <long long*>malloc(3 * n * sizeof(long long))
    cdef unsigned int* crcs = <unsigned int*>malloc(n * sizeof(unsigned int))
    cdef int* errs = <int*>malloc(n * sizeof(int))
    cdef char* wanted = <char*>malloc(n)
    cdef list out = []
    try:
        if not (c_paths and bases and lengths and identities and crcs and errs and wanted):
            raise MemoryError()
        for i in range(n):
            c_paths[i] = <const char*>(<bytes>encoded[i])
            wanted[i] = 1 if checksums[i] else 0
        with nogil:
            for i in range(n):
                errs[i] = 0
                crcs[i] = 0
                bases[i] = insitu_map_path(c_paths[i], &lengths[i], &identities[3 * i])
                if bases[i] == NULL:
                    errs[i] = errno
                elif wanted[i]:
                    crcs[i] = insitu_crc32c(0, bases[i], lengths[i])
        for i in range(n):
            if bases[i] == NULL:
                out.append(OSError(errs[i], os.strerror(errs[i]), os.fsdecode(encoded[i])))
            else:
                mapping = _adopt(bases[i], lengths[i])
                bases[i] = NULL  # the mapping owns it now
                identity = (identities[3 * i], identities[3 * i + 1], identities[3 * i + 2])
                out.append((mapping, identity, crcs[i] if wanted[i] else None))
    finally:
        if bases:
            for i in range(n):  # mapped but never adopted (an error building the results): unmap here
                if bases[i] != NULL:
                    insitu_unmap_file(bases[i], lengths[i])
        free(c_paths)
        free(bases)
        free(lengths)
        free(identities)
        free(crcs)
        free(errs)
        free(wanted)
    return out


def crc32c(data, unsigned int value=0) -> int:
    """The CRC-32C of a contiguous buffer, continuing ``value``; the crc32c package's value, without the GIL."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef unsigned int crc
    cdef size_t n = view.shape[0]
    with nogil:
        crc = insitu_crc32c(value, &view[0] if n else NULL, n)
    return crc
