# Per-tile geometry for copying rows of sample-first tiles into their
# rectangles of a C-contiguous (rows, *inner) destination, shared by the gather
# and assembly kernels. A tile's rectangle inside one destination row is folded
# once (outer extents + one contiguous run, see rect.pxd); a run of rows then
# costs one memcpy when the tile spans the whole row, else one rectangle copy
# per row.
#
# The checks here run in C with the GIL held and report the first offender as
# (status, index); insitubatch.kernels turns that into the exception.

cimport numpy as cnp
from libc.stdlib cimport free, malloc

from rect cimport MAX_DIMS, copy_bytes, copy_rect, ib_stream_fence

cdef enum Status:
    OK = 0
    TILE_NOT_ARRAY = 1       # index: the tile
    TILE_NDIM = 2
    TILE_DTYPE = 3
    TILE_NOT_CONTIGUOUS = 4
    TILE_OUTSIDE = 5         # the tile's rectangle leaves the destination's inner extent
    TILE_ROWS = 6            # assembly: the tile's row count is not the destination's
    RUN_OUTSIDE = 7          # index: the run; it names no tile or leaves a tile's or dst's rows
    NO_MEMORY = 8


cdef struct TileGeom:
    const char* data          # the tile's first byte
    Py_ssize_t row_bytes      # bytes in one tile row (one sample of the tile)
    Py_ssize_t dst_offset     # byte offset of the rectangle's corner in one destination row
    Py_ssize_t run_bytes      # contiguous bytes per innermost run
    int n_outer               # dims walked by the odometer (the rest folded into run_bytes)
    Py_ssize_t* extent        # n_outer entries each, inside TileTable.dims
    Py_ssize_t* dst_strides
    Py_ssize_t* src_strides


cdef struct TileTable:
    TileGeom* geoms
    Py_ssize_t* dims
    Py_ssize_t n_tiles
    Py_ssize_t dst_row_bytes  # bytes in one destination row
    bint stream               # non-temporal stores (a copy too large to keep in cache)


cdef inline Py_ssize_t scan_tiles(
    tuple tiles, cnp.ndarray dst, const cnp.intp_t* origins, cnp.int64_t* shapes, const char** ptrs,
    int* status,
):
    """Check each tile against ``dst`` (GIL held); record its shape and data pointer.

    ``origins`` holds ``len(tiles) * (dst.ndim - 1)`` corners, ``shapes`` room
    for ``len(tiles) * dst.ndim`` extents. Returns the index of the first bad
    tile with its reason in ``status``, or -1 when every tile is usable.
    """
    cdef Py_ssize_t i, o
    cdef int k, ndim = cnp.PyArray_NDIM(dst), nd = ndim - 1
    cdef cnp.npy_intp* dst_dims = cnp.PyArray_DIMS(dst)
    cdef cnp.dtype dtype = <cnp.dtype>cnp.PyArray_DESCR(dst)
    cdef cnp.ndarray a
    cdef cnp.npy_intp* dims
    for i in range(len(tiles)):
        obj = tiles[i]
        if not cnp.PyArray_Check(obj):
            status[0] = TILE_NOT_ARRAY
            return i
        a = <cnp.ndarray>obj
        if cnp.PyArray_NDIM(a) != ndim:
            status[0] = TILE_NDIM
            return i
        # most tiles share dst's descriptor object: skip the full comparison then
        if (<void*>cnp.PyArray_DESCR(a) != <void*>dtype
                and not cnp.PyArray_EquivTypes(<cnp.dtype>cnp.PyArray_DESCR(a), dtype)):
            status[0] = TILE_DTYPE
            return i
        if not cnp.PyArray_IS_C_CONTIGUOUS(a):
            status[0] = TILE_NOT_CONTIGUOUS
            return i
        dims = cnp.PyArray_DIMS(a)
        for k in range(nd):
            o = origins[i * nd + k]
            if o < 0 or o > dst_dims[k + 1] - dims[k + 1]:
                status[0] = TILE_OUTSIDE
                return i
        for k in range(ndim):
            shapes[i * ndim + k] = dims[k]
        ptrs[i] = <const char*>cnp.PyArray_DATA(a)
    status[0] = OK
    return -1


cdef inline Py_ssize_t check_runs(
    const cnp.int64_t* runs, Py_ssize_t n_runs, const cnp.int64_t* shapes, int ndim,
    Py_ssize_t n_tiles, Py_ssize_t dst_rows,
) noexcept nogil:
    """Index of the first run ``[tile, src_row, dst_row, n]`` that does not fit, or -1."""
    cdef Py_ssize_t r
    cdef cnp.int64_t t, s, d, n
    for r in range(n_runs):
        t = runs[4 * r]
        s = runs[4 * r + 1]
        d = runs[4 * r + 2]
        n = runs[4 * r + 3]
        if (t < 0 or t >= n_tiles or n < 0 or s < 0 or s > shapes[t * ndim] - n
                or d < 0 or d > dst_rows - n):
            return r
    return -1


cdef inline int build_table(
    TileTable* tab, const char** ptrs, const cnp.int64_t* shapes, const cnp.intp_t* origins,
    Py_ssize_t n_tiles, const cnp.npy_intp* dst_dims, int ndim, Py_ssize_t itemsize, bint stream,
) noexcept nogil:
    """Fold every tile's rectangle; ``shapes``/``origins`` rows are ``(rows, *inner)``/``inner``.

    Geometry was validated by ``scan_tiles``. Returns 0, or -1 when out of
    memory (``tab`` is then empty and safe to free).
    """
    cdef int nd = ndim - 1            # inner dims
    cdef int k, m
    cdef Py_ssize_t t, acc
    cdef Py_ssize_t inner_strides[MAX_DIMS]
    cdef Py_ssize_t tile_strides[MAX_DIMS]
    cdef const cnp.int64_t* shp
    cdef const cnp.intp_t* org
    cdef TileGeom* g
    cdef Py_ssize_t per_dim = nd if nd > 0 else 1

    tab.geoms = NULL
    tab.dims = NULL
    tab.n_tiles = 0
    tab.stream = stream
    acc = itemsize
    for k in range(nd - 1, -1, -1):
        inner_strides[k] = acc
        acc *= dst_dims[k + 1]
    tab.dst_row_bytes = acc
    if n_tiles == 0:
        return 0
    tab.geoms = <TileGeom*>malloc(n_tiles * sizeof(TileGeom))
    tab.dims = <Py_ssize_t*>malloc(n_tiles * 3 * per_dim * sizeof(Py_ssize_t))
    if tab.geoms == NULL or tab.dims == NULL:
        free_table(tab)
        return -1
    tab.n_tiles = n_tiles

    for t in range(n_tiles):
        g = &tab.geoms[t]
        shp = shapes + t * ndim + 1   # the tile's inner extents
        org = origins + t * nd
        g.data = ptrs[t]
        g.extent = tab.dims + t * 3 * per_dim
        g.dst_strides = g.extent + per_dim
        g.src_strides = g.extent + 2 * per_dim
        acc = itemsize
        for k in range(nd - 1, -1, -1):
            tile_strides[k] = acc
            acc *= shp[k]
        g.row_bytes = acc
        g.dst_offset = 0
        for k in range(nd):
            g.dst_offset += org[k] * inner_strides[k]
        # fold trailing dims the tile spans completely into the contiguous run
        m = nd - 1
        while m > 0 and shp[m] == dst_dims[m + 1]:
            m -= 1
        if m < 0:
            m = 0
        g.run_bytes = itemsize
        for k in range(m, nd):
            g.run_bytes *= shp[k]
        g.n_outer = m
        for k in range(m):
            g.extent[k] = shp[k]
            g.dst_strides[k] = inner_strides[k]
            g.src_strides[k] = tile_strides[k]
    return 0


cdef inline void free_table(TileTable* tab) noexcept nogil:
    free(tab.geoms)
    free(tab.dims)
    tab.geoms = NULL
    tab.dims = NULL
    tab.n_tiles = 0


cdef inline void copy_rows(
    const TileTable* tab, char* dst, Py_ssize_t tile, Py_ssize_t src_row, Py_ssize_t dst_row,
    Py_ssize_t n_rows,
) noexcept nogil:
    """Copy ``n_rows`` tile rows from ``src_row`` into destination rows from ``dst_row``."""
    cdef const TileGeom* g = &tab.geoms[tile]
    cdef Py_ssize_t r, drb = tab.dst_row_bytes
    cdef const char* s
    cdef char* d
    if n_rows <= 0 or g.run_bytes == 0:
        return
    s = g.data + src_row * g.row_bytes
    d = dst + dst_row * drb + g.dst_offset
    if g.n_outer == 0 and g.run_bytes == drb:
        # the tile spans the whole row: consecutive rows are one block
        copy_bytes(d, s, n_rows * drb, tab.stream)
    elif g.n_outer == 0:
        for r in range(n_rows):
            copy_bytes(d + r * drb, s + r * g.row_bytes, g.run_bytes, tab.stream)
    else:
        for r in range(n_rows):
            copy_rect(d + r * drb, g.dst_strides, s + r * g.row_bytes, g.src_strides,
                      g.extent, g.n_outer, g.run_bytes, tab.stream)
    if tab.stream:
        ib_stream_fence()
