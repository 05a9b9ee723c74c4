"""zarr's byte requests as one plain span: the single place that tells a range, an offset and a suffix apart.

zarr asks for a key's bytes as ``None`` (the whole object) or one of three
``ByteRequest`` classes. Every reader (local files, obstore, the engine's own
client, a store of several) takes the :class:`ByteSpan` :func:`byte_span`
returns instead of dispatching on those classes again.
"""

from __future__ import annotations

from typing import NamedTuple

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

__all__ = ["ByteSpan", "byte_span"]


class ByteSpan(NamedTuple):
    """Which bytes of an object: ``start`` up to ``stop`` (``None``: to the end), or its last ``start`` bytes.

    ``from_end`` is True only for a suffix: then ``start`` counts bytes back
    from the end (``0``: no bytes) and ``stop`` is ``None``.
    """

    start: int
    stop: int | None = None
    from_end: bool = False

    def cut(self, data: bytes) -> bytes:
        """The span's bytes of a whole object's ``data`` (a range past the end comes back short)."""
        if self.from_end:
            return data[-self.start :] if self.start else b""
        return data[self.start : self.stop]

    def within(self, size: int) -> tuple[int, int]:
        """``(first, one past the last)`` byte of an object of ``size`` bytes, clipped to it."""
        if self.from_end:
            return max(0, size - self.start), size
        return min(self.start, size), size if self.stop is None else min(self.stop, size)


WHOLE = ByteSpan(0)


def byte_span(byte_range: ByteRequest | None) -> ByteSpan:
    """The :class:`ByteSpan` of a zarr byte request (``None``: the whole object).

    Raises
    ------
    TypeError
        ``byte_range`` is none of zarr's ``RangeByteRequest``,
        ``OffsetByteRequest`` or ``SuffixByteRequest``.
    """
    if byte_range is None:
        return WHOLE
    if isinstance(byte_range, RangeByteRequest):
        return ByteSpan(byte_range.start, byte_range.end)
    if isinstance(byte_range, OffsetByteRequest):
        return ByteSpan(byte_range.offset)
    if isinstance(byte_range, SuffixByteRequest):
        return ByteSpan(byte_range.suffix, None, True)
    raise TypeError(
        f"byte_range={byte_range!r} is not a zarr ByteRequest; expected None, RangeByteRequest, "
        "OffsetByteRequest or SuffixByteRequest"
    )
