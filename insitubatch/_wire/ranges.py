"""What an answer to a ranged GET must be before its bytes are used: the range asked, or provably the whole object.

A ``206`` must carry the range asked (:func:`check_206`: its
``Content-Range`` and length); a ``200`` is used only where it provably is
the whole object (:func:`whole_200`): the GET asked for all of it, or the
answer's ``Content-Range`` names all of it; another 2xx (a ``203``, a
``204``) is never the range (:func:`not_a_range`). Anything else, a gateway's error
page, a 206 relabelled 200, a server that ignores ``Range``, is refused as
obstore refuses it ("Range request not supported"), before its body is
received. ``want`` is the range asked as ``(start, stop)`` (a suffix of
``n`` bytes is ``(-n, 0)``); ``asked`` names the GET in messages
(``"GET /path: asked bytes=0-3, http://host:port"``: the path, never a query).
"""

from __future__ import annotations

import re

import numpy as np

from .faults import RangeIgnoredError, RangeMismatchError

__all__ = ["IGNORED_RANGE_SLACK_BYTES", "check_206", "mismatch", "not_a_range", "whole_200", "within"]

# A 200 to a ranged GET that provably is the whole object (its Content-Range says so) is cut to the range when at
# most this many bytes come before it: a small object, served whole, costs about one chunk-sized read more. Past it
# the GET fails at once rather than receive the object (a 16-byte shard index from a 300 MiB shard, per read).
IGNORED_RANGE_SLACK_BYTES = 1 << 20
_CONTENT_RANGE = re.compile(rb"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


def mismatch(asked: str, sent: str) -> RangeMismatchError:
    return RangeMismatchError(f"{asked} sent {sent}")


def not_a_range(status: int, asked: str) -> RangeIgnoredError:
    """A 2xx other than 200 and 206 (203, 204) to a ranged GET: its body is not the range, and never returned."""
    return RangeIgnoredError(
        f"{asked} answered {status}, neither 206 with the range nor 200 with the whole object: Range request not "
        "supported (obstore refuses it too); serve the store from a server that answers ranges with 206"
    )


def check_206(want: tuple[int, int], crange: bytes | None, length: int | None, asked: str) -> int:
    """The length a 206 must carry for the range ``want``; raises if its ``Content-Range`` (lowered) differs."""
    start, stop = want
    match = None if crange is None else _CONTENT_RANGE.match(crange)
    if match is None:
        raise mismatch(asked, "no Content-Range" if crange is None else f"Content-Range {crange[:60]!r}")
    first, last = int(match.group(1)), int(match.group(2))
    total = None if match.group(3) == b"*" else int(match.group(3))
    if total is None:  # an unknown total proves no end: a shorter range, a rest or a suffix may be cut short
        right = start >= 0 and first == start and last == stop - 1
    elif start >= 0:
        right = first == start and last == min(stop, total) - 1
    else:
        right = first == max(0, total + start) and last == total - 1
    right = right and first <= last and (total is None or last < total)
    if not right or (length is not None and length != last - first + 1):
        sent = f"Content-Range {crange.decode('latin-1').strip()!r}"  # type: ignore[union-attr]
        raise mismatch(asked, sent + (f" and {length} body bytes" if length is not None else ""))
    return last - first + 1


def whole_200(
    want: tuple[int, int], crange: bytes | None, length: int | None, asked: str, to_end: int
) -> tuple[int, int, int] | None:
    """A 200 to a GET of ``want``: ``(start, stop, size)`` to cut from the whole object, or None (all was asked).

    ``to_end``: a ``stop`` past it asks for the rest of the object. Raises
    :class:`RangeIgnoredError` where the answer is not provably the whole
    object, or where more than ``IGNORED_RANGE_SLACK_BYTES`` come before the
    range.
    """
    start, stop = want
    if start == 0 and stop > to_end:
        return None  # the whole object asked for: a 200 is what it asked
    total = _whole_object(crange, length)
    if total is None:
        sent = "no Content-Range" if crange is None else f"Content-Range {crange.decode('latin-1')[:60]!r}"
        size = "" if length is None else f" and {length} body bytes"
        raise RangeIgnoredError(
            f"{asked} answered 200 with {sent}{size}, not provably the whole object: Range request not supported "
            "(obstore refuses it too); serve the store from a server that answers ranges with 206"
        )
    before = start if start >= 0 else max(0, total + start)
    if before > IGNORED_RANGE_SLACK_BYTES:
        raise RangeIgnoredError(
            f"{asked} answered 200 with the whole object of {total} bytes: the server ignores Range requests "
            "(obstore refuses it too); serve the store from one that honours them"
        )
    return start, stop, total


def within(body: bytearray | np.ndarray, cut: tuple[int, int, int], asked: str) -> bytearray | np.ndarray:
    """The range ``cut`` (start, stop, the object's size) of a whole object's ``body`` (or its start)."""
    start, stop, total = cut
    need = min(stop, total) if start >= 0 else total
    if len(body) < need or (start < 0 and len(body) != total):
        raise mismatch(asked, f"200 with {len(body)} body bytes of a {total}-byte object")
    return body[start:stop] if start >= 0 else body[start:]


def _whole_object(crange: bytes | None, length: int | None) -> int | None:
    """The object's size where ``Content-Range`` (lowered) names all of it, consistent with ``length``; else None."""
    match = None if crange is None else _CONTENT_RANGE.match(crange)
    if match is None or match.group(3) == b"*":
        return None
    first, last, total = int(match.group(1)), int(match.group(2)), int(match.group(3))
    if first != 0 or last != total - 1 or (length is not None and length != total):
        return None
    return total
