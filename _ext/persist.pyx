"""A shared file mapping that knows who still looks at it, and the tile write into it.

``FileMapping`` maps a whole file ``MAP_SHARED`` and exports it through the
buffer protocol; ``insitubatch.kernels`` builds the tile-major ``.npy`` tile
file on top (header, sizing, views). ``close()`` unmaps at once when no view is
alive, else as soon as the last view is released — never under a live view.
"""

cimport numpy as cnp
from bytebuf cimport export_bytes
from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport errno
from libc.string cimport memcpy

# mmap/munmap on POSIX; elsewhere a mapping fails with ENOSYS (see the header)
cdef extern from "insitu_platform.h" nogil:
    void* insitu_map_file(int fd, size_t length, int writable)
    int insitu_unmap_file(void* base, size_t length)

cnp.import_array()


cdef class FileMapping:
    """``length`` bytes of the open file ``fd`` mapped shared; the fd may be closed after."""

    cdef char* base
    cdef Py_ssize_t length
    cdef Py_ssize_t stride        # 1: exported as a flat byte vector
    cdef readonly bint writable
    cdef readonly int exports
    cdef bint closing

    def __cinit__(self, int fd, Py_ssize_t length, bint writable):
        cdef void* p
        cdef int err = 0
        self.base = NULL
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
