# The buffer-protocol view both raw-memory owners (a file mapping, a pinned
# host buffer) export: one flat, C-contiguous vector of bytes.

from cpython.buffer cimport PyBUF_FORMAT


cdef inline void export_bytes(
    Py_buffer* buf, void* ptr, Py_ssize_t* length, Py_ssize_t* stride, bint readonly, int flags
) noexcept:
    """Fill every field of ``buf`` but ``obj`` (the caller sets it, so Cython counts the reference)."""
    buf.buf = ptr
    buf.len = length[0]
    buf.readonly = readonly
    buf.itemsize = 1
    if flags & PyBUF_FORMAT:
        buf.format = "B"
    else:
        buf.format = NULL
    buf.ndim = 1
    buf.shape = length
    buf.strides = stride
    buf.suboffsets = NULL
    buf.internal = NULL
