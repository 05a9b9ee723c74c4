"""Tile assembly: copy a decoded tile into its rectangle of a larger buffer,
and fill a rectangle with one value (a bad tile's hole).

Raw byte-level entry points; ``insitubatch.kernels`` validates and computes the
geometry with the GIL held, then calls these, which release it for the copy.
"""

from rect cimport copy_rect, fill_rect


def copy_rect_bytes(
    unsigned char[::1] dst, Py_ssize_t dst_offset, const Py_ssize_t[::1] dst_strides,
    const unsigned char[::1] src, Py_ssize_t src_offset, const Py_ssize_t[::1] src_strides,
    const Py_ssize_t[::1] extent, Py_ssize_t run_bytes,
):
    """Copy ``prod(extent)`` runs of ``run_bytes`` from ``src`` into ``dst``."""
    cdef int ndim = <int>extent.shape[0]
    cdef char* d = <char*>&dst[0] + dst_offset
    cdef const char* s = <const char*>&src[0] + src_offset
    cdef const Py_ssize_t* ds = &dst_strides[0] if ndim else NULL
    cdef const Py_ssize_t* ss = &src_strides[0] if ndim else NULL
    cdef const Py_ssize_t* ex = &extent[0] if ndim else NULL
    with nogil:
        copy_rect(d, ds, s, ss, ex, ndim, run_bytes)


def fill_rect_bytes(
    unsigned char[::1] dst, Py_ssize_t dst_offset, const Py_ssize_t[::1] dst_strides,
    const Py_ssize_t[::1] extent, Py_ssize_t run_bytes, const unsigned char[::1] pattern,
):
    """Fill ``prod(extent)`` runs of ``run_bytes`` in ``dst`` with ``pattern`` repeated."""
    cdef int ndim = <int>extent.shape[0]
    cdef char* d = <char*>&dst[0] + dst_offset
    cdef const Py_ssize_t* ds = &dst_strides[0] if ndim else NULL
    cdef const Py_ssize_t* ex = &extent[0] if ndim else NULL
    cdef Py_ssize_t itemsize = pattern.shape[0]
    with nogil:
        fill_rect(d, ds, ex, ndim, run_bytes, <const char*>&pattern[0], itemsize)
