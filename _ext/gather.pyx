"""Batch gather: copy runs of rows from resident tiles into their rectangles of a batch.

Raw entry point; ``insitubatch.kernels.gather`` shapes the index tables and
turns a non-zero status into the exception. ``gather_runs`` checks every tile
and run in C with the GIL held, then copies the whole batch with it released.
"""

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy

from rect cimport ib_stream_min_bytes
from tiles cimport (
    NO_MEMORY,
    OK,
    RUN_OUTSIDE,
    TILE_DTYPE,
    TILE_NDIM,
    TILE_NOT_ARRAY,
    TILE_NOT_CONTIGUOUS,
    TILE_OUTSIDE,
    TILE_ROWS,
    TileTable,
    build_table,
    check_runs,
    copy_rows,
    free_table,
    scan_tiles,
)

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

# What a non-zero status from gather_runs / assemble.assemble_tiles means.
STATUS = {
    "TILE_NOT_ARRAY": TILE_NOT_ARRAY,
    "TILE_NDIM": TILE_NDIM,
    "TILE_DTYPE": TILE_DTYPE,
    "TILE_NOT_CONTIGUOUS": TILE_NOT_CONTIGUOUS,
    "TILE_OUTSIDE": TILE_OUTSIDE,
    "TILE_ROWS": TILE_ROWS,
    "RUN_OUTSIDE": RUN_OUTSIDE,
    "NO_MEMORY": NO_MEMORY,
}

# Default for ``stream_min_bytes``: a batch moving at least this many bytes is
# written with non-temporal stores (four times the L2 cache, see rect.pxd).
STREAM_MIN_BYTES = ib_stream_min_bytes()

cdef enum:
    # Below this many bytes a batch is copied by the calling thread alone: waking an
    # OpenMP team costs a few microseconds, about what a copy this size takes.
    PARALLEL_MIN_BYTES = 1 << 20
    # Below this many bytes a batch is copied with the GIL held: such a copy takes tens of
    # microseconds, while taking the GIL back from busy decode and loop threads can cost
    # milliseconds (the interpreter's switch interval is 5 ms); bench.engine_probe on small tiles.
    GIL_RELEASE_MIN_BYTES = 1 << 20


def gather_runs(cnp.ndarray out, tuple tiles, cnp.ndarray origins, cnp.ndarray runs,
                Py_ssize_t stream_min_bytes):
    """Copy every run ``[tile, src_row, dst_row, n_rows]`` of ``runs`` into ``out``.

    The caller guarantees ``out`` C-contiguous, writeable and at least 1-d,
    ``origins`` intp ``(len(tiles), out.ndim - 1)`` and ``runs`` int64
    ``(n, 4)``, both C-contiguous. Everything else is checked here. A batch
    moving ``stream_min_bytes`` or more bypasses the caches.

    Returns ``(status, index)``: ``(0, -1)`` after the copy, else a ``STATUS``
    code and the offending tile (``TILE_*``) or run (``RUN_OUTSIDE``); nothing
    was copied then.
    """
    cdef Py_ssize_t n_tiles = len(tiles)
    cdef int ndim = cnp.PyArray_NDIM(out)
    cdef Py_ssize_t n_runs = cnp.PyArray_DIMS(runs)[0]
    cdef char* dst = <char*>cnp.PyArray_DATA(out)
    cdef Py_ssize_t r, bad, moved = 0
    cdef int status = OK
    cdef TileTable tab
    # private copies of the tables: nothing the caller can touch while the GIL is
    # released may change between the checks and the copy
    cdef size_t n = n_tiles if n_tiles else 1
    cdef const char** ptrs = <const char**>malloc(n * sizeof(char*))
    cdef cnp.int64_t* shapes = <cnp.int64_t*>malloc(n * ndim * sizeof(cnp.int64_t))
    cdef cnp.intp_t* corners = <cnp.intp_t*>malloc(n * ndim * sizeof(cnp.intp_t))
    cdef cnp.int64_t* run = <cnp.int64_t*>malloc((n_runs if n_runs else 1) * 4 * sizeof(cnp.int64_t))
    try:
        if ptrs == NULL or shapes == NULL or corners == NULL or run == NULL:
            return NO_MEMORY, -1
        memcpy(corners, cnp.PyArray_DATA(origins), cnp.PyArray_NBYTES(origins))
        memcpy(run, cnp.PyArray_DATA(runs), cnp.PyArray_NBYTES(runs))
        bad = scan_tiles(tiles, out, corners, shapes, ptrs, &status)
        if status != OK:
            return status, bad
        bad = check_runs(run, n_runs, shapes, ndim, n_tiles, cnp.PyArray_DIMS(out)[0])
        if bad >= 0:
            return RUN_OUTSIDE, bad
        if build_table(&tab, ptrs, shapes, corners, n_tiles, cnp.PyArray_DIMS(out), ndim,
                       cnp.PyArray_ITEMSIZE(out), False) != 0:
            return NO_MEMORY, -1
        for r in range(n_runs):
            moved += run[4 * r + 3] * tab.geoms[run[4 * r]].row_bytes
        tab.stream = moved >= stream_min_bytes
        if moved < GIL_RELEASE_MIN_BYTES:  # a copy this small costs less than taking the GIL back after it
            for r in range(n_runs):
                copy_rows(&tab, dst, run[4 * r], run[4 * r + 1], run[4 * r + 2], run[4 * r + 3])
        else:
            with nogil:
                for r in prange(n_runs, schedule="dynamic",
                                use_threads_if=n_runs > 1 and moved >= PARALLEL_MIN_BYTES):
                    copy_rows(&tab, dst, run[4 * r], run[4 * r + 1], run[4 * r + 2], run[4 * r + 3])
        free_table(&tab)
        return status, bad
    finally:
        free(ptrs)
        free(shapes)
        free(corners)
        free(run)


cdef int cmp_int64(const void* a, const void* b) noexcept nogil:
    cdef cnp.int64_t x = (<const cnp.int64_t*>a)[0], y = (<const cnp.int64_t*>b)[0]
    return (x > y) - (x < y)


cdef Py_ssize_t find(const cnp.int64_t* sorted_values, Py_ssize_t m, cnp.int64_t value) noexcept nogil:
    cdef Py_ssize_t lo = 0, hi = m, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if sorted_values[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def batch_runs(cnp.ndarray samples, cnp.int64_t size, Py_ssize_t n_tiles):
    """The chunks a batch draws from and its copy runs, in one pass over its samples.

    ``samples`` (int64, C-contiguous, >= 0) are the batch's rows on one array's
    sample axis, ``size`` rows per chunk, ``n_tiles`` tiles per chunk. Returns
    ``(chunks, runs)``: the distinct chunk indices, ascending, and int64 runs
    ``[tile, src_row, dst_row, n]`` where ``tile`` counts ``n_tiles`` per chunk
    in ``chunks`` order — what ``gather_runs`` takes once the entries' tiles are
    listed in that order. Consecutive samples on consecutive rows of one chunk
    become one run.
    """
    cdef Py_ssize_t n = cnp.PyArray_DIMS(samples)[0], i, t, k = 0, m = 0
    cdef const cnp.int64_t* s = <const cnp.int64_t*>cnp.PyArray_DATA(samples)
    cdef cnp.ndarray order = cnp.PyArray_EMPTY(1, [max(n, 1)], cnp.NPY_INT64, 0)
    cdef cnp.int64_t* u = <cnp.int64_t*>cnp.PyArray_DATA(order)
    cdef cnp.ndarray table = cnp.PyArray_EMPTY(2, [max(n * n_tiles, 1), 4], cnp.NPY_INT64, 0)
    cdef cnp.int64_t* run = <cnp.int64_t*>cnp.PyArray_DATA(table)
    cdef cnp.int64_t c, w, tile
    # O(samples x tiles) integer work, with the GIL held: far cheaper than giving it up and taking it back
    for i in range(n):
        u[i] = s[i] // size
    qsort(u, n, sizeof(cnp.int64_t), cmp_int64)
    for i in range(n):
        if m == 0 or u[i] != u[m - 1]:
            u[m] = u[i]
            m += 1
    for t in range(n_tiles):
        for i in range(n):
            c = s[i] // size
            w = s[i] - c * size
            tile = find(u, m, c) * n_tiles + t
            if (k > 0 and run[4 * (k - 1)] == tile and run[4 * (k - 1) + 1] + run[4 * (k - 1) + 3] == w
                    and run[4 * (k - 1) + 2] + run[4 * (k - 1) + 3] == i):
                run[4 * (k - 1) + 3] += 1
            else:
                run[4 * k] = tile
                run[4 * k + 1] = w
                run[4 * k + 2] = i
                run[4 * k + 3] = 1
                k += 1
    return order[:m], table[:k]
