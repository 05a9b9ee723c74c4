"""Batch gather: copy runs of rows from resident tiles into their rectangles of a batch.

Raw entry points; ``insitubatch.kernels.gather`` validates the index tables with
the GIL held, then ``gather_runs`` copies the whole batch with it released.
"""

cimport cython
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

from tiles cimport TileTable, build_table, copy_rows, free_table, scan_tiles

cnp.import_array()

cdef extern from *:
    """
    #ifdef _OPENMP
    #define INSITUBATCH_OPENMP 1
    #else
    #define INSITUBATCH_OPENMP 0
    #endif
    """
    const int INSITUBATCH_OPENMP

# Built with OpenMP (INSITUBATCH_OPENMP=1 at build time): runs are copied by a team of threads.
OPENMP = bool(INSITUBATCH_OPENMP)

# Below this many bytes a batch is copied by the calling thread alone: waking an
# OpenMP team costs a few microseconds, which is what a copy this size takes.
cdef enum:
    PARALLEL_MIN_BYTES = 1 << 20


def scan(tuple tiles, cnp.ndarray dst):
    """Check tiles against ``dst``; return ``(status, bad_index, shapes)``.

    ``shapes`` is int64 ``(len(tiles), dst.ndim)``; ``status`` is one of the
    ``TILE_*`` codes in ``tiles.pxd`` (0 when every tile is usable).
    """
    cdef int status = 0
    cdef cnp.ndarray shapes = cnp.PyArray_EMPTY(
        2, [len(tiles), cnp.PyArray_NDIM(dst)], cnp.NPY_INT64, 0)
    cdef Py_ssize_t bad = scan_tiles(tiles, dst, <cnp.int64_t*>cnp.PyArray_DATA(shapes), NULL, &status)
    return status, bad, shapes


@cython.boundscheck(False)
def gather_runs(cnp.ndarray out, tuple tiles, cnp.ndarray shapes, cnp.ndarray origins, cnp.ndarray runs):
    """Copy every run ``[tile, src_row, dst_row, n_rows]`` of ``runs`` into ``out``.

    Every argument was validated by the caller: ``out`` and ``tiles`` C-contiguous
    of one dtype, ``shapes`` int64 and ``origins`` intp C-contiguous tables from
    ``scan``, ``runs`` int64 ``(n, 4)`` C-contiguous and inside the tiles and ``out``.
    Returns 0, or -1 when the tile table could not be allocated.
    """
    cdef Py_ssize_t n_tiles = len(tiles)
    cdef Py_ssize_t n_runs = cnp.PyArray_DIMS(runs)[0]
    cdef const cnp.int64_t* run = <const cnp.int64_t*>cnp.PyArray_DATA(runs)
    cdef char* dst = <char*>cnp.PyArray_DATA(out)
    cdef TileTable tab
    cdef Py_ssize_t r, moved = 0
    cdef int status = 0, ndim = cnp.PyArray_NDIM(out)
    cdef const char** ptrs = <const char**>malloc((n_tiles if n_tiles else 1) * sizeof(char*))
    if ptrs == NULL:
        return -1
    scan_tiles(tiles, out, <cnp.int64_t*>cnp.PyArray_DATA(shapes), ptrs, &status)
    with nogil:
        status = build_table(
            &tab, ptrs, <const cnp.int64_t*>cnp.PyArray_DATA(shapes),
            <const cnp.intp_t*>cnp.PyArray_DATA(origins), n_tiles, cnp.PyArray_DIMS(out), ndim,
            cnp.PyArray_ITEMSIZE(out))
        if status == 0:
            for r in range(n_runs):
                moved += run[4 * r + 3]
            moved *= tab.dst_row_bytes
            for r in prange(n_runs, schedule="dynamic",
                            use_threads_if=n_runs > 1 and moved >= PARALLEL_MIN_BYTES):
                copy_rows(&tab, dst, run[4 * r], run[4 * r + 1], run[4 * r + 2], run[4 * r + 3])
        free_table(&tab)
        free(ptrs)
    return status
