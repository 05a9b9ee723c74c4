"""How long a read may take, how often it is tried again, and what a failed attempt means.

The engine reads a remote obstore store through a twin with obstore's
retries off (``stores.reading``) and retries in its own loop, so that it
sees each throttling answer and each stalled attempt. :func:`policy_for`
takes that loop's bounds from the store's ``retry_config`` (``max_retries``,
``backoff``, ``retry_timeout``) and ``client_options`` (``read_timeout``,
the longest the stall timer may grow), falling back to the defaults of
``stores.options`` for what the store leaves unset. The store carries the
:class:`ReadPolicy` in its reader; the engine's loop (``_engine.reads.fetch``)
applies it, and :func:`classify` sorts a failed attempt (an error of one of
the store's backends: obstore's, the engine's own client's, a store's own
``get``) into what the loop does next.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import obstore.exceptions

from .._wire.faults import (
    FramingError,
    NoSuchBucketError,
    RangeIgnoredError,
    RangeMismatchError,
    RedirectError,
    TlsRefusedError,
    UnsupportedBodyError,
)
from ..errors import ForkError
from .options import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRY_TIMEOUT,
    OBSTORE_BACKOFF_BASE,
    OBSTORE_INIT_BACKOFF,
    OBSTORE_MAX_BACKOFF,
)
from .wire_settings import duration_s

__all__ = [
    "PRECONDITION_FAILED",
    "Outcome",
    "ReadPolicy",
    "changed",
    "classify",
    "http_status",
    "policy_for",
    "protocol_fault",
]

# obstore's own backoff defaults (written once in stores.options), in seconds for the loop.
DEFAULT_INIT_BACKOFF_S = OBSTORE_INIT_BACKOFF.total_seconds()
DEFAULT_MAX_BACKOFF_S = OBSTORE_MAX_BACKOFF.total_seconds()
DEFAULT_BACKOFF_BASE = OBSTORE_BACKOFF_BASE


@dataclass(frozen=True)
class ReadPolicy:
    """The retry loop's bounds for one store.

    A read is tried at most ``1 + max_retries`` times; no attempt starts
    later than ``retry_timeout_s`` after the first, and a silent attempt is
    cut at that point too, so a read that never gets an answer fails within
    about ``retry_timeout_s``. Attempt ``n`` waits ``init_backoff_s *
    backoff_base ** (n - 1)`` (at most ``max_backoff_s``) before it starts.
    ``read_timeout_s`` caps the stall timer.
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT.total_seconds()
    init_backoff_s: float = DEFAULT_INIT_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    backoff_base: float = DEFAULT_BACKOFF_BASE
    read_timeout_s: float = duration_s(DEFAULT_READ_TIMEOUT, 30.0)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` (2 is the first retry)."""
        return min(self.max_backoff_s, self.init_backoff_s * self.backoff_base ** max(0, attempt - 2))


def policy_for(retry_config: Mapping[str, Any] | None, client_options: Mapping[str, Any] | None) -> ReadPolicy:
    """The bounds a store's settings give (its unset keys: insitubatch's defaults)."""
    retry = dict(retry_config or {})
    backoff = dict(retry.get("backoff") or {})
    default = ReadPolicy()
    return ReadPolicy(
        max_retries=int(retry.get("max_retries", default.max_retries)),
        retry_timeout_s=duration_s(retry.get("retry_timeout"), default.retry_timeout_s),
        init_backoff_s=duration_s(backoff.get("init_backoff"), default.init_backoff_s),
        max_backoff_s=duration_s(backoff.get("max_backoff"), default.max_backoff_s),
        backoff_base=float(backoff.get("base", default.backoff_base)),
        read_timeout_s=duration_s((client_options or {}).get("read_timeout"), default.read_timeout_s),
    )


# An answer meaning "slow down": S3 SlowDown (503), GCS and Azure 429 / 503; and their words, for a
# store whose errors carry no status
_THROTTLE_STATUS = (429, 503)
_THROTTLE = re.compile(r"\b(429|503)\b|SlowDown|Slow Down|TooManyRequests|RequestLimitExceeded|Throttl", re.IGNORECASE)
_STATUS = re.compile(r"status code: (\d{3})")
# S3's answer for a bucket that is not at the endpoint: a 404 through either client, never a missing key.
_NO_SUCH_BUCKET = "<Code>NoSuchBucket</Code>"
# obstore's words for an answer it cannot frame or use (a header it needs and did not get: a chunked 206; another range).
_PROTOCOL_WORDS = re.compile(r"Header|Content-Length|Content-Range|Range request|UnexpectedRange", re.IGNORECASE)
# The status of a conditional read (If-Match) of an object that is no longer that version (RFC 9110 15.5.13).
PRECONDITION_FAILED = 412
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


def changed(exc: BaseException) -> bool:
    """Whether a conditional read failed because the object is no longer the version it named (412).

    Not a failure of the link: the caller reads what the object is now (``shard_index``).
    """
    return isinstance(exc, obstore.exceptions.PreconditionError) or http_status(exc) == PRECONDITION_FAILED


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
            obstore.exceptions.PreconditionError,  # (a 412: the object changed; trying again will not help)
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
