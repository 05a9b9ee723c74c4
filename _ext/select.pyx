"""Selection copy: the selected block of a decoded tile, row by row, into a C-contiguous piece.

A selection keeps, per field axis, a list of positions (strided, reversed or
any order) or one position (a dropped axis). ``select_rows`` copies every row
of ``src`` through per-axis byte-offset tables into ``dest``, which is
C-contiguous ``(rows, *kept extents)``. Runs along the last axis whose
offsets advance by one element are one ``memcpy``; anything else is copied
element by element. Raw entry point: ``insitubatch._engine.tiles.kernels.select_block``
validates the tables with the GIL held; this only copies, without it.
"""

cimport numpy as cnp
from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

cnp.import_array()

cdef enum:
    MAX_KEPT = 64


cdef inline void copy_element(char* d, const char* s, Py_ssize_t itemsize) noexcept nogil:
    if itemsize == 4:
        (<uint32_t*>d)[0] = (<const uint32_t*>s)[0]
    elif itemsize == 8:
        (<uint64_t*>d)[0] = (<const uint64_t*>s)[0]
    elif itemsize == 2:
        (<uint16_t*>d)[0] = (<const uint16_t*>s)[0]
    elif itemsize == 1:
        d[0] = s[0]
    else:
        memcpy(d, s, <size_t>itemsize)


cdef void select_rows_c(
    char* dst, const char* src, Py_ssize_t rows, Py_ssize_t src_row_bytes,
    const cnp.int64_t* offsets, const Py_ssize_t* starts, const Py_ssize_t* extents, int kept,
    Py_ssize_t fixed, Py_ssize_t itemsize, bint last_run,
) noexcept nogil:
    """Copy ``rows`` rows; axis ``j``'s offsets are ``offsets[starts[j]:starts[j] + extents[j]]``."""
    cdef Py_ssize_t r, i, j, inner_n, carry
    cdef Py_ssize_t counter[MAX_KEPT]
    cdef Py_ssize_t partial[MAX_KEPT + 1]
    cdef const char* row
    cdef const cnp.int64_t* last
    if kept == 0:
        for r in range(rows):
            copy_element(dst, src + r * src_row_bytes + fixed, itemsize)
            dst += itemsize
        return
    inner_n = extents[kept - 1]
    last = offsets + starts[kept - 1]
    for r in range(rows):
        row = src + r * src_row_bytes + fixed
        for j in range(kept - 1):
            counter[j] = 0
        partial[0] = 0
        for j in range(kept - 1):
            partial[j + 1] = partial[j] + offsets[starts[j]]
        while True:
            if last_run:
                memcpy(dst, row + partial[kept - 1] + last[0], <size_t>(inner_n * itemsize))
                dst += inner_n * itemsize
            else:
                for i in range(inner_n):
                    copy_element(dst, row + partial[kept - 1] + last[i], itemsize)
                    dst += itemsize
            # advance the odometer over the outer kept axes, innermost first
            j = kept - 2
            while j >= 0:
                counter[j] += 1
                if counter[j] < extents[j]:
                    break
                counter[j] = 0
                j -= 1
            if j < 0:
                break
            for carry in range(j, kept - 1):
                partial[carry + 1] = partial[carry] + offsets[starts[carry] + counter[carry]]


def select_rows(
    cnp.ndarray dest, cnp.ndarray src, const cnp.int64_t[::1] offsets, const Py_ssize_t[::1] starts,
    const Py_ssize_t[::1] extents, Py_ssize_t fixed, bint last_run,
):
    """Copy the selected block of every row of ``src`` into ``dest`` (both C-contiguous, checked by the caller)."""
    cdef int kept = <int>extents.shape[0]
    cdef Py_ssize_t rows = cnp.PyArray_DIMS(src)[0]
    cdef Py_ssize_t src_row_bytes = cnp.PyArray_STRIDES(src)[0] if cnp.PyArray_NDIM(src) else 0
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(dest)
    cdef char* d = <char*>cnp.PyArray_DATA(dest)
    cdef const char* s = <const char*>cnp.PyArray_DATA(src)
    cdef const cnp.int64_t* off = &offsets[0] if offsets.shape[0] else NULL
    cdef const Py_ssize_t* st = &starts[0] if kept else NULL
    cdef const Py_ssize_t* ex = &extents[0] if kept else NULL
    if kept > MAX_KEPT:
        raise ValueError(f"a selection keeps at most {MAX_KEPT} axes, got {kept}")
    if rows == 0:
        return
    with nogil:
        select_rows_c(d, s, rows, src_row_bytes, off, st, ex, kept, fixed, itemsize, last_run)
