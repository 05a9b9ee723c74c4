"""Which reads a dataset has fetched before: one byte per sample-axis chunk of each source, never a list of keys.

A read is ``(source, chunk index)``. A pass that admits a read fetched
before (by any pass of the dataset) is re-reading what the pool let go: the
pass stats count those (``re_reads``) to tell a budget too small from a slow
store. The record is a flag per chunk, grown to the highest chunk index
seen: bounded by the arrays' chunk counts however many passes and epochs
run, unlike a set of the keys read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["SeenReads"]


@dataclass(eq=False)
class SeenReads:
    """A flag per ``(source, chunk index)``: set once the read was fetched."""

    _flags: dict[str, bytearray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, source: str, chunk_index: int) -> bool:
        """Record that ``(source, chunk_index)`` is being fetched; whether it was fetched before."""
        with self._lock:
            flags = self._flags.setdefault(source, bytearray())
            if chunk_index >= len(flags):
                flags.extend(bytes(chunk_index + 1 - len(flags)))
            seen = bool(flags[chunk_index])
            flags[chunk_index] = 1
            return seen

    @property
    def nbytes(self) -> int:
        """Bytes the flags occupy."""
        with self._lock:
            return sum(len(f) for f in self._flags.values())
