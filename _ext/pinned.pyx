"""Page-aligned host memory that can be locked, exported through the buffer protocol.

``HostBuffer`` owns one ``posix_memalign`` allocation and frees it (unlocking
first) when the object dies, which is after the last array viewing it has
died: every view holds an export, counted in ``exports``.
``insitubatch.pinned.PinnedBufferPool`` decides when to lock and when to reuse.
"""

from bytebuf cimport export_bytes
from libc.errno cimport errno
from libc.stdlib cimport free
from posix.mman cimport mlock, munlock
from posix.stdlib cimport posix_memalign


cdef class HostBuffer:
    """``nbytes`` of uninitialised memory aligned to ``alignment`` (a power of two)."""

    cdef void* ptr
    cdef Py_ssize_t length
    cdef Py_ssize_t stride
    cdef readonly bint locked
    cdef readonly int exports
    cdef object __weakref__

    def __cinit__(self, Py_ssize_t nbytes, Py_ssize_t alignment):
        cdef void* p = NULL
        cdef int rc
        if nbytes <= 0:
            raise ValueError(f"{nbytes=} must be > 0")
        if alignment <= 0 or (alignment & (alignment - 1)) != 0:
            raise ValueError(f"{alignment=} must be a power of two")
        with nogil:
            rc = posix_memalign(&p, <size_t>alignment, <size_t>nbytes)
        if rc != 0:
            raise MemoryError(f"posix_memalign could not allocate {nbytes} bytes aligned to {alignment}")
        self.ptr = p
        self.length = nbytes
        self.stride = 1

    def lock(self):
        """Lock the pages in RAM with ``mlock``; returns 0 or the ``errno`` of the failure."""
        cdef int rc, err = 0
        if self.locked:
            return 0
        with nogil:
            rc = mlock(self.ptr, <size_t>self.length)
            if rc != 0:
                err = errno
        self.locked = rc == 0
        return err

    @property
    def address(self) -> int:
        return <size_t>self.ptr

    @property
    def nbytes(self) -> int:
        return self.length

    def __getbuffer__(self, Py_buffer* buf, int flags):
        export_bytes(buf, self.ptr, &self.length, &self.stride, 0, flags)
        buf.obj = self
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buf):
        self.exports -= 1

    def __dealloc__(self):
        if self.ptr != NULL:
            with nogil:
                if self.locked:
                    munlock(self.ptr, <size_t>self.length)
                free(self.ptr)
            self.ptr = NULL
