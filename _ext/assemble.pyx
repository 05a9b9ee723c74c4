"""Tile assembly: copy decoded tiles into their rectangles of a larger buffer,
and fill a rectangle with one value (a bad tile's hole).

Raw byte-level entry points; ``insitubatch.kernels`` validates and computes the
geometry with the GIL held, then calls these, which release it for the copy.
"""

cimport numpy as cnp
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from rect cimport fill_rect
from tiles cimport NO_MEMORY, OK, TILE_ROWS, TileTable, build_table, copy_rows, free_table, scan_tiles

cnp.import_array()


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


def assemble_tiles(cnp.ndarray dest, tuple tiles, cnp.ndarray origins, Py_ssize_t stream_min_bytes):
    """Copy every row of each tile into its rectangle of ``dest`` in one GIL-free pass.

    The caller guarantees ``dest`` C-contiguous, writeable and at least 1-d and
    ``origins`` intp ``(len(tiles), dest.ndim - 1)`` C-contiguous; the tiles are
    checked here (as in ``gather.gather_runs``) and must have ``dest``'s rows.
    A ``dest`` of ``stream_min_bytes`` or more is written bypassing the caches.
    Returns ``(status, index)`` like ``gather.gather_runs``.
    """
    cdef Py_ssize_t t, n_tiles = len(tiles)
    cdef int ndim = cnp.PyArray_NDIM(dest)
    cdef cnp.int64_t rows = cnp.PyArray_DIMS(dest)[0]
    cdef char* dst = <char*>cnp.PyArray_DATA(dest)
    cdef Py_ssize_t bad
    cdef int status = OK
    cdef TileTable tab
    # private copies of the tables, as in gather.gather_runs
    cdef size_t n = n_tiles if n_tiles else 1
    cdef const char** ptrs = <const char**>malloc(n * sizeof(char*))
    cdef cnp.int64_t* shapes = <cnp.int64_t*>malloc(n * ndim * sizeof(cnp.int64_t))
    cdef cnp.intp_t* corners = <cnp.intp_t*>malloc(n * ndim * sizeof(cnp.intp_t))
    try:
        if ptrs == NULL or shapes == NULL or corners == NULL:
            return NO_MEMORY, -1
        memcpy(corners, cnp.PyArray_DATA(origins), cnp.PyArray_NBYTES(origins))
        bad = scan_tiles(tiles, dest, corners, shapes, ptrs, &status)
        if status != OK:
            return status, bad
        for t in range(n_tiles):
            if shapes[t * ndim] != rows:
                return TILE_ROWS, t
        with nogil:
            if build_table(&tab, ptrs, shapes, corners, n_tiles, cnp.PyArray_DIMS(dest), ndim,
                           cnp.PyArray_ITEMSIZE(dest), cnp.PyArray_NBYTES(dest) >= stream_min_bytes) != 0:
                status = NO_MEMORY
            else:
                for t in range(n_tiles):
                    copy_rows(&tab, dst, t, 0, 0, rows)
                free_table(&tab)
        return status, -1
    finally:
        free(ptrs)
        free(shapes)
        free(corners)
