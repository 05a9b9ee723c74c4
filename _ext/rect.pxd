# Shared C helpers for copying n-dimensional rectangles between C-contiguous
# buffers. Everything is in bytes: callers pass itemsize-scaled extents, so one
# routine serves every fixed-size dtype.

from libc.string cimport memcpy

cdef enum:
    MAX_DIMS = 64


cdef inline void copy_rect(
    char* dst, const Py_ssize_t* dst_strides,
    const char* src, const Py_ssize_t* src_strides,
    const Py_ssize_t* extent, int ndim, Py_ssize_t run_bytes,
) noexcept nogil:
    """Copy ``extent[0:ndim]`` outer positions, each a contiguous ``run_bytes``.

    ``dst_strides``/``src_strides`` are byte strides of the outer dims; the
    innermost contiguous run has already been folded into ``run_bytes``.
    """
    cdef Py_ssize_t idx[MAX_DIMS]
    cdef Py_ssize_t total = 1
    cdef Py_ssize_t n, d, doff = 0, soff = 0
    cdef int k
    if run_bytes == 0:
        return
    for k in range(ndim):
        if extent[k] == 0:
            return
        total *= extent[k]
        idx[k] = 0
    for n in range(total):
        memcpy(dst + doff, src + soff, <size_t>run_bytes)
        # odometer increment over the outer dims, last dim fastest
        k = ndim - 1
        while k >= 0:
            idx[k] += 1
            doff += dst_strides[k]
            soff += src_strides[k]
            if idx[k] < extent[k]:
                break
            doff -= dst_strides[k] * extent[k]
            soff -= src_strides[k] * extent[k]
            idx[k] = 0
            k -= 1


cdef inline void fill_rect(
    char* dst, const Py_ssize_t* dst_strides, const Py_ssize_t* extent, int ndim,
    Py_ssize_t run_bytes, const char* pattern, Py_ssize_t itemsize,
) noexcept nogil:
    """Fill each outer position's ``run_bytes`` run with a repeated ``itemsize`` pattern."""
    cdef Py_ssize_t idx[MAX_DIMS]
    cdef Py_ssize_t total = 1
    cdef Py_ssize_t n, doff = 0, b
    cdef int k
    if run_bytes == 0:
        return
    for k in range(ndim):
        if extent[k] == 0:
            return
        total *= extent[k]
        idx[k] = 0
    for n in range(total):
        # write one item, then double the filled prefix with memcpy
        memcpy(dst + doff, pattern, <size_t>itemsize)
        b = itemsize
        while b < run_bytes:
            if 2 * b <= run_bytes:
                memcpy(dst + doff + b, dst + doff, <size_t>b)
                b *= 2
            else:
                memcpy(dst + doff + b, dst + doff, <size_t>(run_bytes - b))
                b = run_bytes
        k = ndim - 1
        while k >= 0:
            idx[k] += 1
            doff += dst_strides[k]
            if idx[k] < extent[k]:
                break
            doff -= dst_strides[k] * extent[k]
            idx[k] = 0
            k -= 1
