"""What a failed read attempt means for the engine's retry loop; the bounds themselves travel with the store.

The engine reads a remote store through its reader (``stores.reading``),
whose :class:`~insitubatch.stores.read_policy.ReadPolicy` bounds the loop's
retries; :func:`classify` sorts a failed attempt into what the loop does next.
"""

from __future__ import annotations

import enum
import re

import obstore.exceptions

from ..._wire.faults import (
    FramingError,
    NoSuchBucketError,
    RangeIgnoredError,
    RangeMismatchError,
    RedirectError,
    TlsRefusedError,
    UnsupportedBodyError,
)
from ...errors import ForkError
from ...stores.read_policy import ReadPolicy, policy_for

__all__ = ["Outcome", "ReadPolicy", "classify", "policy_for", "protocol_fault"]

# An answer meaning "slow down": S3 SlowDown (503), GCS and Azure 429 / 503; and their words, for a
# store whose errors carry no status
_THROTTLE_STATUS = (429, 503)
_THROTTLE = re.compile(r"\b(429|503)\b|SlowDown|Slow Down|TooManyRequests|RequestLimitExceeded|Throttl", re.IGNORECASE)
_STATUS = re.compile(r"status code: (\d{3})")
# S3's answer for a bucket that is not at the endpoint: a 404 through either client, never a missing key.
_NO_SUCH_BUCKET = "<Code>NoSuchBucket</Code>"
# obstore's words for an answer it cannot frame or use (a header it needs and did not get: a chunked 206; another range).
_PROTOCOL_WORDS = re.compile(r"Header|Content-Length|Content-Range|Range request|UnexpectedRange", re.IGNORECASE)
# A client error that trying again will not fix (408 Request Timeout and 429 are worth another try).
_RETRYABLE_4XX = (408, 429)


class Outcome(enum.Enum):
    """What a failed attempt means for its read."""

    MISSING = "missing"  # the key does not exist: the read returns None (zarr's fill value)
    FATAL = "fatal"  # trying again will not help (denied, bad request): the read fails now
    RETRY = "retry"  # a transient failure (5xx, a dropped connection, a cut body): try again
    THROTTLE = "throttle"  # the store asks to slow down: try again, and the window backs off


def http_status(exc: BaseException) -> int | None:
    """The HTTP status a store's error reports, or None when its message names none."""
    status = _STATUS.search(str(exc))
    return None if status is None else int(status.group(1))


def protocol_fault(exc: BaseException) -> bool:
    """An answer the client could not frame or use (not a dropped connection, not a status).

    Retried once; the same fault again from the same read is the server's
    way of answering, and the read fails (``fetch``).
    """
    if isinstance(exc, (FramingError, RangeMismatchError)):
        return True
    return (
        isinstance(exc, obstore.exceptions.GenericError)
        and http_status(exc) is None
        and _PROTOCOL_WORDS.search(str(exc)) is not None
    )


def classify(exc: BaseException) -> Outcome:
    """Sort a failed attempt's exception; anything unrecognised is transient."""
    if isinstance(exc, NoSuchBucketError):
        return Outcome.FATAL
    if isinstance(exc, (FileNotFoundError, obstore.exceptions.NotFoundError)):
        return Outcome.FATAL if _NO_SUCH_BUCKET in str(exc) else Outcome.MISSING
    if isinstance(exc, (RangeMismatchError, FramingError)):  # (their messages hold byte counts, not statuses)
        return Outcome.RETRY
    if isinstance(exc, (RangeIgnoredError, RedirectError, TlsRefusedError, UnsupportedBodyError, ForkError)):
        return Outcome.FATAL
    if isinstance(
        exc,
        (
            obstore.exceptions.PermissionDeniedError,
            obstore.exceptions.UnauthenticatedError,
            obstore.exceptions.InvalidPathError,
            obstore.exceptions.NotSupportedError,
            obstore.exceptions.UnknownConfigurationKeyError,
            PermissionError,
            ValueError,
            TypeError,
        ),
    ):
        return Outcome.FATAL
    text = str(exc)
    code = http_status(exc)
    if code is None:  # no HTTP status in the message (another store's error): its words decide
        return Outcome.THROTTLE if _THROTTLE.search(text) else Outcome.RETRY
    if code in _THROTTLE_STATUS or "SlowDown" in text:
        return Outcome.THROTTLE
    if 300 <= code < 500 and code not in _RETRYABLE_4XX:  # (a 3xx left is one nothing could follow)
        return Outcome.FATAL
    return Outcome.RETRY
