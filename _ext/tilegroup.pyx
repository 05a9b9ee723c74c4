"""Read a group of local chunk files and decompress each straight into its tile, GIL released once.

Raw entry point; ``insitubatch._engine.tiles.kernels.read_decode_group`` binds the
codec and shapes the arguments. A decode thread of a local store otherwise
gives up and takes back the GIL five times per tile (open, fstat, read, close,
decode); on small tiles that hand-over, not the codec, set the pace.

The codecs are the ones numcodecs already loaded: its zstd and blosc
extensions export the libraries' C entry points (``ZSTD_decompress``,
``blosc_decompress_ctx``), found with ``dlsym`` on the loaded module, so the
bytes are decoded by the very code numcodecs would run. A tile whose file is
missing, unreadable, larger than the scratch buffer, or whose frame does not
declare exactly the tile's size is reported, untouched, for the caller's
general path, which raises or falls back exactly as it always does.
``decode_group`` is the same for a batch of chunks already in memory (a
network store's tiles that landed together).
"""

cimport numpy as cnp
from libc.errno cimport EISDIR, ENOENT, ENOTDIR, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cnp.import_array()


# open/read/close, dlopen/dlsym and clock_gettime on POSIX; stand-ins elsewhere (see the header)
cdef extern from "insitu_platform.h" nogil:
    int insitu_open_read(const char* path)
    long long insitu_read(int fd, void* buf, size_t count)
    int insitu_close(int fd)
    void* insitu_loaded_module(const char* file)
    void* insitu_symbol(void* module, const char* name)
    void insitu_release_module(void* module)
    long long insitu_monotonic_ns()


ctypedef size_t (*zstd_decompress_fn)(void* dst, size_t capacity, const void* src, size_t size) noexcept nogil
ctypedef unsigned (*zstd_is_error_fn)(size_t code) noexcept nogil
ctypedef int (*blosc_decompress_fn)(const void* src, void* dst, size_t capacity, int threads) noexcept nogil

cdef zstd_decompress_fn zstd_decompress = NULL
cdef zstd_is_error_fn zstd_is_error = NULL
cdef blosc_decompress_fn blosc_decompress = NULL

# codec kinds (``kernels.FAST_CODECS`` names them)
cdef enum:
    ZSTD = 1
    BLOSC = 2

# per-tile outcomes; anything but DONE leaves the tile untouched for the general path
cdef enum:
    DONE = 0
    MISSING = 1        # no such file (or a directory): the general path reads it as the fill value
    IO_ERROR = 2       # open/read failed otherwise: the general path raises the store error
    TOO_BIG = 3        # the file does not fit the scratch buffer (or grew while read)
    FRAME = 4          # the frame does not declare the tile's size, or is malformed
    CODEC = 5          # the codec reported an error, or produced another size

# the most dims a tile may have (copy_prefix's odometer)
cdef enum:
    MAX_DIMS_C = 32

# for Python: a placed tile, a file that did not fit the scratch buffer, the most dims a tile may have
PLACED = DONE
GROW = TOO_BIG
MAX_DIMS = MAX_DIMS_C

# blosc 1.x header: version, versionlz, flags, typesize, then nbytes, blocksize, cbytes (uint32 LE)
cdef enum:
    BLOSC_HEADER = 16
    BLOSC_MEMCPYED = 0x02
cdef uint64_t ZSTD_MAGIC = 0xFD2FB528


def bind(int kind, bytes module_file) -> bool:
    """Find ``kind``'s entry points in the already loaded extension ``module_file``; False when absent."""
    global zstd_decompress, zstd_is_error, blosc_decompress
    cdef void* handle = insitu_loaded_module(module_file)
    if handle == NULL:
        return False
    cdef void* a
    cdef void* b
    if kind == ZSTD:
        a = insitu_symbol(handle, b"ZSTD_decompress")
        b = insitu_symbol(handle, b"ZSTD_isError")
        if a != NULL and b != NULL:
            zstd_decompress = <zstd_decompress_fn>a
            zstd_is_error = <zstd_is_error_fn>b
    elif kind == BLOSC:
        a = insitu_symbol(handle, b"blosc_decompress_ctx")
        if a != NULL:
            blosc_decompress = <blosc_decompress_fn>a
    insitu_release_module(handle)  # NOLOAD took a reference to the loaded module; it stays loaded
    return bound(kind)


def bound(int kind) -> bool:
    """Whether ``kind`` can be decoded here."""
    if kind == ZSTD:
        return zstd_decompress != NULL and zstd_is_error != NULL
    if kind == BLOSC:
        return blosc_decompress != NULL
    return False


cdef inline uint64_t le(const uint8_t* p, int n) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef int64_t zstd_content_size(const uint8_t* src, size_t n) noexcept nogil:
    """The size a zstd frame header declares (RFC 8878 §3.1.1), or -1 when absent or unreadable."""
    if n < 6 or le(src, 4) != ZSTD_MAGIC:
        return -1
    cdef int fhd = src[4]
    cdef bint single = (fhd & 0x20) != 0
    cdef int fcs_code = fhd >> 6
    cdef int size
    if fcs_code == 0:
        size = 1 if single else 0
    elif fcs_code == 1:
        size = 2
    elif fcs_code == 2:
        size = 4
    else:
        size = 8
    if size == 0:
        return -1
    cdef int dict_code = fhd & 0x03
    cdef int dict_bytes = 0 if dict_code == 0 else (1 if dict_code == 1 else (2 if dict_code == 2 else 4))
    cdef size_t pos = 5 + (0 if single else 1) + dict_bytes
    if n < pos + size:
        return -1
    cdef uint64_t value = le(src + pos, size)
    if size == 2:
        value += 256
    return <int64_t>value


cdef int decode_one(int kind, const uint8_t* src, size_t n, void* dst, size_t capacity) noexcept nogil:
    cdef size_t got
    cdef int rc
    if kind == ZSTD:
        if zstd_content_size(src, n) != <int64_t>capacity:
            return FRAME
        got = zstd_decompress(dst, capacity, src, n)
        if zstd_is_error(got) or got != capacity:
            return CODEC
        return DONE
    # blosc: the header must agree with the frame's length before c-blosc trusts it
    if n < BLOSC_HEADER or le(src + 12, 4) != n or le(src + 4, 4) != capacity:
        return FRAME
    if (src[2] & BLOSC_MEMCPYED) and capacity + BLOSC_HEADER != n:
        return FRAME
    rc = blosc_decompress(src, dst, capacity, 1)
    if rc < 0 or <size_t>rc != capacity:
        return CODEC
    return DONE


cdef int read_file(const char* path, uint8_t* buf, size_t capacity, size_t* nread) noexcept nogil:
    """Read the whole file at ``path`` into ``buf``; one byte spare tells a file that filled it."""
    cdef int fd = insitu_open_read(path)
    cdef long long got
    cdef size_t n = 0
    cdef int err
    if fd < 0:
        err = errno
        return MISSING if err == ENOENT or err == ENOTDIR or err == EISDIR else IO_ERROR
    while True:
        got = insitu_read(fd, buf + n, capacity - n)
        if got < 0:
            err = errno
            insitu_close(fd)
            return MISSING if err == EISDIR else IO_ERROR
        if got == 0:
            break
        n += got
        if n == capacity:
            insitu_close(fd)
            return TOO_BIG
    insitu_close(fd)
    nread[0] = n
    return DONE


cdef inline int64_t now_ns() noexcept nogil:
    return <int64_t>insitu_monotonic_ns()


cdef void copy_prefix(
    const uint8_t* src, const int64_t* whole, uint8_t* dst, const cnp.npy_intp* part, int ndim, size_t itemsize,
) noexcept nogil:
    """Copy the leading ``part`` block of a C-order ``whole``-shaped array into a contiguous ``dst``."""
    cdef int64_t index[MAX_DIMS_C]
    cdef size_t stride[MAX_DIMS_C]
    cdef int k
    cdef size_t run = <size_t>part[ndim - 1] * itemsize
    cdef size_t offset
    cdef int64_t rows = 1
    stride[ndim - 1] = itemsize
    for k in range(ndim - 2, -1, -1):
        stride[k] = stride[k + 1] * <size_t>whole[k + 1]
    for k in range(ndim - 1):
        index[k] = 0
        rows *= part[k]
    if run == 0 or rows == 0:
        return
    while True:
        offset = 0
        for k in range(ndim - 1):
            offset += <size_t>index[k] * stride[k]
        memcpy(dst, src + offset, run)
        dst += run
        k = ndim - 2
        while k >= 0:
            index[k] += 1
            if index[k] < part[k]:
                break
            index[k] = 0
            k -= 1
        if k < 0:
            return


cdef struct Tile:
    const char* path      # read_decode: the chunk file
    const uint8_t* src    # decode_group: the chunk's bytes
    size_t nsrc
    uint8_t* dst          # the tile's memory
    size_t size           # its bytes
    size_t whole          # its stored chunk's bytes (== size for a full tile)
    const int64_t* shape  # its stored chunk's shape
    cnp.npy_intp* part    # its own shape (an edge tile's leading block)
    size_t itemsize


cdef int describe(Tile* tile, object dest, const int64_t* shape, int ndim, Py_ssize_t index) except -1:
    """Check a destination tile against its stored chunk's shape (GIL held) and fill in ``tile``."""
    cdef cnp.ndarray d = <cnp.ndarray?>dest
    cdef int k
    if not cnp.PyArray_IS_C_CONTIGUOUS(d) or not cnp.PyArray_ISWRITEABLE(d) or cnp.PyArray_NDIM(d) != ndim:
        raise ValueError(f"dests[{index}] must be C-contiguous, writeable and {ndim}-d; stored has one entry per dim")
    tile.itemsize = <size_t>cnp.PyArray_ITEMSIZE(d)
    tile.whole = tile.itemsize
    for k in range(ndim):
        if shape[k] < 0 or cnp.PyArray_DIMS(d)[k] > shape[k]:
            raise ValueError(f"dests[{index}] of shape {dest.shape} is larger than its stored chunk")
        tile.whole *= <size_t>shape[k]
    tile.dst = <uint8_t*>cnp.PyArray_DATA(d)
    tile.size = <size_t>cnp.PyArray_NBYTES(d)
    tile.shape = shape
    tile.part = cnp.PyArray_DIMS(d)
    return 0


cdef int place(int kind, const uint8_t* src, size_t n, const Tile* tile, int ndim, uint8_t* whole,
               size_t wcapacity) noexcept nogil:
    """Decompress ``src`` into the tile: straight in when full, else its chunk into ``whole`` and the block out."""
    cdef int rc
    if tile.size == tile.whole:
        return decode_one(kind, src, n, tile.dst, tile.size)
    if tile.whole > wcapacity:
        return TOO_BIG
    rc = decode_one(kind, src, n, whole, tile.whole)
    if rc == DONE:
        copy_prefix(whole, tile.shape, tile.dst, tile.part, ndim, tile.itemsize)
    return rc


cdef int check_kind(int kind) except -1:
    if kind not in (ZSTD, BLOSC) or not bound(kind):
        raise ValueError(f"codec kind {kind} is not bound")
    return 0


def read_decode(
    int kind, list paths, list dests, cnp.ndarray stored, cnp.ndarray scratch, cnp.ndarray whole,
    cnp.ndarray status, cnp.ndarray nbytes, cnp.ndarray times,
):
    """Read ``paths[i]`` and decompress it into ``dests[i]`` for every i, with the GIL released once.

    ``stored`` (int64, ``(n, ndim)``) is each tile's stored chunk shape. A
    tile of that shape is decompressed straight into ``dests[i]``; a smaller
    one (an edge: the leading block of its chunk) into ``whole`` first, then
    its block copied. The caller guarantees: ``paths`` are ``bytes``;
    ``scratch`` and ``whole`` C-contiguous uint8 buffers; ``status`` int32 and
    ``nbytes`` int64, C-contiguous of ``len(paths)``; ``times`` int64 of 2
    (read and decode nanoseconds, added to). Fills ``status[i]`` (0 when
    placed) and ``nbytes[i]`` (the file's size).
    """
    cdef Py_ssize_t n = len(paths), i
    cdef int ndim = cnp.PyArray_DIMS(stored)[1] if cnp.PyArray_NDIM(stored) == 2 else 0
    check_kind(kind)
    if len(dests) != n or cnp.PyArray_DIMS(status)[0] < n or cnp.PyArray_DIMS(nbytes)[0] < n:
        raise ValueError("paths, dests, status and nbytes must have one entry per tile")
    if (cnp.PyArray_TYPE(stored) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(stored)
            or cnp.PyArray_DIMS(stored)[0] != n or not 1 <= ndim <= MAX_DIMS_C):
        raise ValueError(f"stored must be a C-contiguous int64 array of one shape of 1 to {MAX_DIMS} dims per tile")
    cdef Tile* tiles = <Tile*>malloc(max(n, 1) * sizeof(Tile))
    if tiles == NULL:
        raise MemoryError()
    cdef const int64_t* shapes = <const int64_t*>cnp.PyArray_DATA(stored)
    cdef int32_t* st = <int32_t*>cnp.PyArray_DATA(status)
    cdef int64_t* nb = <int64_t*>cnp.PyArray_DATA(nbytes)
    cdef int64_t* tm = <int64_t*>cnp.PyArray_DATA(times)
    cdef uint8_t* buf = <uint8_t*>cnp.PyArray_DATA(scratch)
    cdef size_t capacity = <size_t>cnp.PyArray_NBYTES(scratch)
    cdef uint8_t* wbuf = <uint8_t*>cnp.PyArray_DATA(whole)
    cdef size_t wcapacity = <size_t>cnp.PyArray_NBYTES(whole)
    cdef bytes path
    cdef size_t got
    cdef int rc
    cdef int64_t t0, t1, t2
    try:
        for i in range(n):
            describe(&tiles[i], dests[i], shapes + i * ndim, ndim, i)
            path = <bytes?>paths[i]  # the list keeps it alive for the call
            tiles[i].path = path
        with nogil:
            for i in range(n):
                t0 = now_ns()
                got = 0
                rc = read_file(tiles[i].path, buf, capacity, &got)
                t1 = now_ns()
                nb[i] = <int64_t>got
                if rc == DONE:
                    rc = place(kind, buf, got, &tiles[i], ndim, wbuf, wcapacity)
                t2 = now_ns()
                st[i] = rc
                tm[0] += t1 - t0
                tm[1] += t2 - t1
    finally:
        free(tiles)


def decode_group(
    int kind, list srcs, list dests, cnp.ndarray stored, cnp.ndarray whole, cnp.ndarray status, cnp.ndarray times,
):
    """Decompress ``srcs[i]`` into ``dests[i]`` for every i, with the GIL released once: ``read_decode`` for bytes
    already in memory (a network store's landed batch).

    ``srcs[i]`` is a C-contiguous uint8 array of one chunk's bytes (the list
    keeps them alive for the call); ``stored``, ``dests``, ``whole`` and
    ``status`` as in ``read_decode``; ``times`` int64 of at least 1 (decode
    nanoseconds, added to). A tile whose status is not 0 is left untouched.
    """
    cdef Py_ssize_t n = len(srcs), i
    cdef int ndim = cnp.PyArray_DIMS(stored)[1] if cnp.PyArray_NDIM(stored) == 2 else 0
    check_kind(kind)
    if len(dests) != n or cnp.PyArray_DIMS(status)[0] < n or cnp.PyArray_TYPE(status) != cnp.NPY_INT32:
        raise ValueError("srcs, dests and status (int32) must have one entry per tile")
    if (cnp.PyArray_TYPE(stored) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(stored)
            or cnp.PyArray_DIMS(stored)[0] != n or not 1 <= ndim <= MAX_DIMS_C):
        raise ValueError(f"stored must be a C-contiguous int64 array of one shape of 1 to {MAX_DIMS} dims per tile")
    if not cnp.PyArray_IS_C_CONTIGUOUS(whole) or cnp.PyArray_TYPE(times) != cnp.NPY_INT64:
        raise ValueError("whole must be C-contiguous and times int64")
    cdef Tile* tiles = <Tile*>malloc(max(n, 1) * sizeof(Tile))
    if tiles == NULL:
        raise MemoryError()
    cdef const int64_t* shapes = <const int64_t*>cnp.PyArray_DATA(stored)
    cdef int32_t* st = <int32_t*>cnp.PyArray_DATA(status)
    cdef int64_t* tm = <int64_t*>cnp.PyArray_DATA(times)
    cdef uint8_t* wbuf = <uint8_t*>cnp.PyArray_DATA(whole)
    cdef size_t wcapacity = <size_t>cnp.PyArray_NBYTES(whole)
    cdef cnp.ndarray src
    cdef int64_t t0
    try:
        for i in range(n):
            describe(&tiles[i], dests[i], shapes + i * ndim, ndim, i)
            src = <cnp.ndarray?>srcs[i]
            if not cnp.PyArray_IS_C_CONTIGUOUS(src) or cnp.PyArray_ITEMSIZE(src) != 1:
                raise ValueError(f"srcs[{i}] must be a C-contiguous array of bytes")
            tiles[i].src = <const uint8_t*>cnp.PyArray_DATA(src)
            tiles[i].nsrc = <size_t>cnp.PyArray_NBYTES(src)
        with nogil:
            t0 = now_ns()
            for i in range(n):
                st[i] = place(kind, tiles[i].src, tiles[i].nsrc, &tiles[i], ndim, wbuf, wcapacity)
            tm[0] += now_ns() - t0
    finally:
        free(tiles)


def decode_buffer(int kind, cnp.ndarray src, cnp.ndarray dest, cnp.ndarray stored, cnp.ndarray whole) -> int:
    """Decompress one chunk held in memory into ``dest``, GIL released: ``read_decode`` for bytes already read.

    ``src`` is the chunk's bytes (C-contiguous), ``stored`` (int64, 1-d) its
    shape, ``dest`` a C-contiguous writeable tile of as many dims, no larger;
    a smaller one gets the chunk's leading block through ``whole``. Returns
    0 when placed; any other status leaves ``dest`` untouched.
    """
    cdef int ndim = cnp.PyArray_NDIM(dest)
    check_kind(kind)
    if (cnp.PyArray_TYPE(stored) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(stored)
            or cnp.PyArray_NDIM(stored) != 1 or cnp.PyArray_DIMS(stored)[0] != ndim or not 1 <= ndim <= MAX_DIMS_C):
        raise ValueError(f"stored must be a C-contiguous int64 shape with one entry per dim of dest (1 to {MAX_DIMS})")
    if not cnp.PyArray_IS_C_CONTIGUOUS(src) or not cnp.PyArray_IS_C_CONTIGUOUS(whole):
        raise ValueError("src and whole must be C-contiguous")
    cdef Tile tile
    describe(&tile, dest, <const int64_t*>cnp.PyArray_DATA(stored), ndim, 0)
    cdef const uint8_t* s = <const uint8_t*>cnp.PyArray_DATA(src)
    cdef size_t n = <size_t>cnp.PyArray_NBYTES(src)
    cdef uint8_t* w = <uint8_t*>cnp.PyArray_DATA(whole)
    cdef size_t wcapacity = <size_t>cnp.PyArray_NBYTES(whole)
    cdef int rc
    with nogil:
        rc = place(kind, s, n, &tile, ndim, w, wcapacity)
    return rc
