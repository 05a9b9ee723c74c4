"""The private engine: one pass's fetch scheduler, chunk pool, gather kernels, batch buffers and producer thread, all reading a ``PassContext``."""
