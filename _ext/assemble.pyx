"""Tile assembly: copy decoded tiles into their rectangles of a larger buffer,
and fill a rectangle with one value (a bad tile's hole).

Raw byte-level entry points; ``insitubatch.kernels`` validates and computes the
geometry with the GIL held, then calls these, which release it for the copy.
"""

cimport numpy as cnp
from libc.stdlib cimport free, malloc

from rect cimport copy_rect, fill_rect
from tiles cimport TileTable, build_table, copy_rows, free_table, scan_tiles

cnp.import_array()


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


def assemble_tiles(cnp.ndarray slot, tuple tiles, cnp.ndarray shapes, cnp.ndarray origins):
    """Copy every row of each tile into its rectangle of ``slot`` in one GIL-free pass.

    ``tiles``/``shapes``/``origins`` as for ``gather.gather_runs``, validated by
    the caller, every tile with ``slot``'s row count. Returns 0, or -1 when the
    tile table could not be allocated.
    """
    cdef Py_ssize_t t, n_tiles = len(tiles)
    cdef const cnp.int64_t* shp = <const cnp.int64_t*>cnp.PyArray_DATA(shapes)
    cdef char* dst = <char*>cnp.PyArray_DATA(slot)
    cdef int status = 0, ndim = cnp.PyArray_NDIM(slot)
    cdef TileTable tab
    cdef const char** ptrs = <const char**>malloc((n_tiles if n_tiles else 1) * sizeof(char*))
    if ptrs == NULL:
        return -1
    scan_tiles(tiles, slot, <cnp.int64_t*>cnp.PyArray_DATA(shapes), ptrs, &status)
    with nogil:
        status = build_table(
            &tab, ptrs, shp, <const cnp.intp_t*>cnp.PyArray_DATA(origins), n_tiles,
            cnp.PyArray_DIMS(slot), ndim, cnp.PyArray_ITEMSIZE(slot))
        if status == 0:
            for t in range(n_tiles):
                copy_rows(&tab, dst, t, 0, 0, shp[t * ndim])
        free_table(&tab)
        free(ptrs)
    return status
