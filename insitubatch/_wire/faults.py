"""What can go wrong between a GET and its bytes, one type each, so the retry loop can sort them.

Every fault names the request by its path only: a URL's query may carry a
token (a presigned or SAS URL), which never goes into a message.
``stores.read_policy.classify`` retries :class:`RangeMismatchError`
and :class:`FramingError` (a server or proxy having a bad moment), unless the
same fault comes twice running, and fails at once on the rest.
"""

from __future__ import annotations

__all__ = [
    "FramingError",
    "HttpStatusError",
    "NoSuchBucketError",
    "RangeIgnoredError",
    "RangeMismatchError",
    "RedirectError",
    "TlsRefusedError",
    "UnsupportedBodyError",
]

# How much of an error body a message quotes.
ERROR_QUOTE_BYTES = 512


class HttpStatusError(OSError):
    """A GET answered with a status other than 2xx, 401, 403 or 404 (``status code: NNN`` in the message)."""

    def __init__(self, status: int, target: str, body: bytes) -> None:
        text = body[:ERROR_QUOTE_BYTES].decode("utf-8", "replace").strip()
        super().__init__(f"GET {target}: status code: {status}" + (f": {text}" if text else ""))
        self.status = status


class NoSuchBucketError(OSError):
    """S3 answered 404 ``NoSuchBucket``: the bucket is not at that endpoint, which no chunk's absence explains.

    Not a ``FileNotFoundError``: a missing key reads as zarr's fill value,
    a missing bucket must fail the read.
    """


class RangeMismatchError(OSError):
    """A 206 whose ``Content-Range`` or body length is not the range asked for: its bytes are never returned."""


class RangeIgnoredError(OSError):
    """A server answered a ranged GET with the whole object, far larger than the range: it ignores ``Range``."""


class FramingError(ConnectionError):
    """A response the client cannot frame: a malformed status line, length, chunk size or an oversized head."""


class RedirectError(OSError):
    """A redirect that cannot be followed: too many hops, no ``Location``, or S3 naming another region."""

    def __init__(self, message: str, region: str | None = None) -> None:
        super().__init__(message)
        self.region = region


class UnsupportedBodyError(OSError):
    """A body the client cannot read at all (a transfer coding other than ``chunked``): the same on every try."""


class TlsRefusedError(ConnectionError):
    """The server's TLS certificate was refused (an unknown CA, another name, expired): retrying will not help."""
