"""The options every store ``obstore_store`` builds starts from, and how a caller's options merge into them.

The defaults (:data:`DEFAULT_CLIENT_OPTIONS`, :data:`DEFAULT_RETRY`) are
insitubatch's network policy: a stalled or failing request surfaces as an
error within about a minute, never a hang. The helpers check and merge what
a caller passes, with messages naming the option and the URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

__all__ = [
    "DEFAULT_CLIENT_OPTIONS",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_RETRY",
    "DEFAULT_RETRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "NO_RETRIES",
    "OBSTORE_BACKOFF_BASE",
    "OBSTORE_CONNECT_TIMEOUT",
    "OBSTORE_INIT_BACKOFF",
    "OBSTORE_MAX_BACKOFF",
    "OBSTORE_MAX_RETRIES",
    "OBSTORE_POOL_IDLE_TIMEOUT",
]

# The keys obstore's RetryConfig reads; obstore silently ignores any other key,
# so a typo would otherwise pass unnoticed.
_RETRY_KEYS = frozenset({"backoff", "max_retries", "retry_timeout"})

# obstore's own defaults (object_store's ClientOptions, RetryConfig and BackoffConfig), written here once:
# insitubatch's network policy below starts from them, and the engine's own client and retry loop
# (stores.wire_settings, stores.read_policy) fall back to them where a store leaves a key unset.
OBSTORE_CONNECT_TIMEOUT = timedelta(seconds=5)
OBSTORE_POOL_IDLE_TIMEOUT = timedelta(seconds=90)  # how long an idle connection lives (reqwest/hyper's pool)
OBSTORE_MAX_RETRIES = 10
OBSTORE_INIT_BACKOFF = timedelta(milliseconds=100)  # the first retry's wait, doubling ...
OBSTORE_BACKOFF_BASE = 2.0
OBSTORE_MAX_BACKOFF = timedelta(seconds=15)  # ... up to this

# Network defaults of every remote store obstore_store builds (HTTP, S3, GCS,
# Azure). A caller's ``retry=`` / ``client_options=`` keys override them one by
# one. obstore retries 5xx answers, dropped connections, truncated bodies and
# timeouts of reads with exponential backoff (OBSTORE_INIT_BACKOFF doubling to OBSTORE_MAX_BACKOFF); a client
# error such as 403 fails at once. So a persistent fault surfaces as an error
# after at most DEFAULT_RETRY_TIMEOUT plus one attempt (itself bounded by
# DEFAULT_TIMEOUT), a stalled attempt after DEFAULT_READ_TIMEOUT -- never a hang.
# A response that sends no byte for this long is stalled: the attempt fails and
# is retried. A per-read timeout, so it does not grow with the object's size.
DEFAULT_READ_TIMEOUT = "30s"
# The whole request, connect to last body byte. obstore's own default (30 s)
# fails every read of a large shard on a shared link (256 MB at the 4 MB/s one
# of 32 concurrent streams gets takes 64 s); 10 min carries a 4 GiB stored chunk
# (arrays.MAX_CHUNK_BYTES) at ~7 MB/s.
DEFAULT_TIMEOUT = "600s"
# Establishing a TCP (+TLS) connection (obstore's default), as the duration string obstore echoes back.
DEFAULT_CONNECT_TIMEOUT = f"{OBSTORE_CONNECT_TIMEOUT.total_seconds():g}s"
# Retries of one request (obstore's default), and the time after its first
# attempt when no further retry starts: 45 s, not obstore's 3 min, so that a key
# that never answers surfaces within a minute. The loader's own reads retry in
# the engine's loop under the same two bounds (see docs/tuning.md).
DEFAULT_MAX_RETRIES = OBSTORE_MAX_RETRIES
DEFAULT_RETRY_TIMEOUT = timedelta(seconds=45)
DEFAULT_CLIENT_OPTIONS: Mapping[str, Any] = {
    "read_timeout": DEFAULT_READ_TIMEOUT,
    "timeout": DEFAULT_TIMEOUT,
    "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
}
DEFAULT_RETRY: Mapping[str, Any] = {"max_retries": DEFAULT_MAX_RETRIES, "retry_timeout": DEFAULT_RETRY_TIMEOUT}
# The retry config of a store's retry-free twin, which the engine's own retry loop reads through (stores.reading).
NO_RETRIES: Mapping[str, Any] = {"max_retries": 0, "retry_timeout": timedelta(0)}


def reject_options(url: str, kind: str, given: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` for any given option that this kind of URL cannot use."""
    refused = [name for name in given if name not in allowed]
    if refused:
        shown = ", ".join(f"{name}={given[name]!r}" for name in refused)
        accepts = ", ".join(allowed) if allowed else "none of them"
        raise ValueError(f"{shown} cannot be used with {kind} url={url!r}; options that apply there: {accepts}")


def merged_client_options(
    url: str, client_options: Mapping[str, Any] | None, allow_http: bool | None, default_allow_http: bool
) -> dict[str, Any]:
    """Merge ``allow_http`` into the HTTP client options, refusing a contradiction."""
    if client_options is not None and not isinstance(client_options, Mapping):
        raise TypeError(f"client_options must be a dict, got {type(client_options).__name__}")
    options = {**DEFAULT_CLIENT_OPTIONS, **(client_options or {})}
    if allow_http is not None:
        if "allow_http" in options:
            raise ValueError(
                f"allow_http={allow_http!r} and client_options['allow_http']={options['allow_http']!r} "
                f"both given for url={url!r}; give it once"
            )
        options["allow_http"] = allow_http
    elif default_allow_http:
        options.setdefault("allow_http", True)
    return options


def retry_config_with(retry: Mapping[str, Any] | None) -> dict[str, Any]:
    """``DEFAULT_RETRY`` with the caller's ``retry`` keys on top."""
    if retry is None:
        return dict(DEFAULT_RETRY)
    if not isinstance(retry, Mapping):
        raise TypeError(f"retry must be a dict of obstore RetryConfig keys, got {type(retry).__name__}")
    unknown = sorted(set(retry) - _RETRY_KEYS)
    if unknown:
        raise ValueError(f"retry has unknown keys {unknown}; valid keys are {sorted(_RETRY_KEYS)}")
    return {**DEFAULT_RETRY, **retry}


def merge_config(url: str, config: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Add the free-form ``**options`` to the config the named options built."""
    for key, value in options.items():
        if key in config:
            raise ValueError(
                f"option {key}={value!r} for url={url!r} repeats what a named option already set "
                f"({key}={config[key]!r}); give it once"
            )
        config[key] = value
    return config
