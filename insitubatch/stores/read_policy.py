"""How long a read may take and how often it is tried again: a store's own settings, read once when it is built.

The engine reads a remote obstore store through a twin with obstore's
retries off (``stores.reading``) and retries in its own loop, so that it
sees each throttling answer and each stalled attempt. :func:`policy_for`
takes that loop's bounds from the store's ``retry_config`` (``max_retries``,
``backoff``, ``retry_timeout``) and ``client_options`` (``read_timeout``,
the longest the stall timer may grow), falling back to the defaults of
``stores.options`` for what the store leaves unset. The store carries the
:class:`ReadPolicy` in its reader; the engine's loop (``_engine.reads``)
applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .options import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRY_TIMEOUT,
    OBSTORE_BACKOFF_BASE,
    OBSTORE_INIT_BACKOFF,
    OBSTORE_MAX_BACKOFF,
)
from .wire_settings import duration_s

__all__ = ["ReadPolicy", "policy_for"]

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
