"""What the engine's own HTTP client needs from an obstore store to read it, or why it cannot.

The engine sends GETs itself (``_wire.engine_client``) for an obstore
``HTTPStore`` and for an ``S3Store`` that is anonymous (``skip_signature``)
or has static keys, and a region. :func:`engine_settings` reads the store's
config, its client options and the ``AWS_*`` environment obstore also reads
(the config first), and returns the :class:`EngineSettings` the requests are
built from, or one short reason, naming the setting, why obstore's client
keeps the store. A setting that changes a request and is not carried by
:class:`EngineSettings` sends the store to obstore: the two stay in step.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import obstore.store

from ..config import parse_flag
from .options import OBSTORE_CONNECT_TIMEOUT, OBSTORE_POOL_IDLE_TIMEOUT

__all__ = ["EngineSettings", "S3Keys", "duration_s", "engine_settings"]

# obstore's own defaults where a store leaves these unset, in seconds (written once in stores.options).
OBSTORE_CONNECT_TIMEOUT_S = OBSTORE_CONNECT_TIMEOUT.total_seconds()
OBSTORE_POOL_IDLE_TIMEOUT_S = OBSTORE_POOL_IDLE_TIMEOUT.total_seconds()

# Client options the engine applies (timeouts, the pool, the user agent, a CA) or that change nothing a GET
# sends (``timeout``/``read_timeout``: the engine's stall timer; ``http1_only``: it speaks only HTTP/1.1;
# ``randomize_addresses``: it takes a host's addresses in turn anyway).
_APPLIED_OPTIONS = frozenset(
    {
        "allow_http",
        "timeout",
        "connect_timeout",
        "read_timeout",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "http1_only",
        "user_agent",
        "root_certificate",
        "randomize_addresses",
    }
)
# S3 config keys the engine applies, or that only change writes.
_S3_KEYS = frozenset(
    {
        "bucket",
        "region",
        "endpoint",
        "access_key_id",
        "secret_access_key",
        "session_token",
        "token",
        "skip_signature",
        "virtual_hosted_style_request",
        "unsigned_payload",
        "conditional_put",
        "copy_if_not_exists",
        "disable_tagging",
        "checksum_algorithm",
    }
)
# obstore's names of the S3 settings the engine applies, each to one name.
_S3_ALIASES = {
    "access_key_id": "access_key_id",
    "secret_access_key": "secret_access_key",
    "session_token": "token",
    "token": "token",
    "region": "region",
    "default_region": "region",
    "endpoint": "endpoint",
    "endpoint_url": "endpoint",
    "skip_signature": "skip_signature",
    "virtual_hosted_style_request": "virtual_hosted_style_request",
    "bucket": "bucket",
}
# Environment obstore applies to a GET and the engine does not: such a store keeps obstore's client.
_AWS_NOT_APPLIED = frozenset(
    {
        "AWS_REQUEST_PAYER",
        "AWS_SSE_CUSTOMER_KEY_BASE64",
        "AWS_S3_EXPRESS",
        "AWS_PROXY_URL",
        "AWS_PROXY_CA_CERTIFICATE",
        "AWS_PROXY_EXCLUDES",
        "AWS_ALLOW_INVALID_CERTIFICATES",
    }
)
# The S3-only endpoint variable of AWS's SDKs: obstore takes it over every other endpoint, the store's
# config included (checked against obstore 0.12.1: tests/_wire/test_wire_s3.py).
S3_ENDPOINT_ENV = "AWS_ENDPOINT_URL_S3"
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")

# obstore's duration strings ("5s", "2h 37min", "500ms"): spans of a number and a unit (months are "M").
_SPAN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")
_UNIT_S = {
    **dict.fromkeys(("nsec", "ns"), 1e-9),
    **dict.fromkeys(("usec", "us"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "secs", "s", ""), 1.0),
    **dict.fromkeys(("minutes", "minute", "min", "mins", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hr", "hrs", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0),
    **dict.fromkeys(("months", "month", "M"), 30.44 * 86400.0),
    **dict.fromkeys(("years", "year", "y"), 365.25 * 86400.0),
}


def duration_s(value: Any, default: float) -> float:
    """Seconds in a ``timedelta``, a number, or an obstore duration string; ``default`` for anything else."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value.strip():
        return default
    total, pos, text = 0.0, 0, value.strip()
    while pos < len(text):
        span = _SPAN.match(text, pos)
        if span is None:
            return default
        unit = span.group(2)
        scale = _UNIT_S.get(unit, _UNIT_S.get(unit.lower()))
        if scale is None:
            return default
        total += float(span.group(1)) * scale
        pos = span.end()
    return total


@dataclass(frozen=True)
class S3Keys:
    """Static S3 credentials and the region requests are signed for."""

    access_key_id: str
    secret_access_key: str = ""
    token: str | None = None
    region: str = ""

    def __repr__(self) -> str:  # never the secret or the token
        return f"S3Keys(access_key_id={self.access_key_id!r}, region={self.region!r})"


@dataclass(frozen=True)
class EngineSettings:
    """Everything the engine's requests to one store depend on.

    ``path`` is the encoded URL path every key is under (no trailing
    slash); ``query`` the URL's query string, sent on every request ("" for
    none); ``keys`` signs S3 requests (``None``: unsigned); ``reason`` says
    in a few words why the engine reads this store.
    """

    scheme: str
    host: str
    port: int
    path: str
    query: str = ""
    allow_http: bool = False
    connect_timeout_s: float = OBSTORE_CONNECT_TIMEOUT_S
    pool_idle_timeout_s: float = OBSTORE_POOL_IDLE_TIMEOUT_S
    max_idle: int | None = None
    user_agent: str | None = None
    root_certificate: str | bytes | None = None
    keys: S3Keys | None = None
    s3: bool = False
    reason: str = ""


def _true(value: Any) -> bool:
    return parse_flag(value, "allow_http")


def _s3_settings(config: dict[str, Any], options: dict[str, Any]) -> dict[str, str] | str:
    """What obstore's S3 store will use, from its config and the ``AWS_*`` environment; or why not.

    The config wins over the environment, except ``AWS_ENDPOINT_URL_S3``,
    which wins over the config's ``endpoint`` as it does in obstore.
    ``options`` (the client options) gains ``allow_http`` from ``AWS_ALLOW_HTTP``.
    """
    unknown = sorted(set(config) - _S3_KEYS)
    if unknown:
        return f"S3 config {unknown[0]!r} is set and changes requests"
    settings = {_S3_ALIASES[k]: str(v) for k, v in config.items() if k in _S3_ALIASES}
    from_env: dict[str, str] = {}
    for name, value in os.environ.items():
        if not name.startswith("AWS_"):
            continue
        if name in _AWS_NOT_APPLIED:
            return f"{name} is set in the environment"
        if name == "AWS_ALLOW_HTTP":
            options.setdefault("allow_http", value)
            continue
        if name == S3_ENDPOINT_ENV:
            continue  # (below: it overrides the config)
        key = _S3_ALIASES.get(name[4:].lower())
        if key is None:
            continue  # what does not change a GET (write settings, credential sources: keys come first)
        if from_env.setdefault(key, value) != value:
            return f"two AWS_* variables give the {key} different values (which one obstore takes is undefined)"
    for key, value in from_env.items():
        settings.setdefault(key, value)
    s3_endpoint = os.environ.get(S3_ENDPOINT_ENV)
    if s3_endpoint is not None:
        if not s3_endpoint.strip():
            return f"{S3_ENDPOINT_ENV} is set but empty"
        settings["endpoint"] = s3_endpoint
    return settings


def _options(options: Mapping[str, Any]) -> dict[str, Any] | str:
    """The client options, or why the engine cannot apply them."""
    unknown = sorted(set(options) - _APPLIED_OPTIONS)
    if unknown:
        return f"client_options[{unknown[0]!r}] is set"
    proxy = next((name for name in _PROXY_ENV if os.environ.get(name)), None)
    if proxy is not None:
        return f"{proxy} is set in the environment (a proxy)"
    return dict(options)


def _endpoint(url: str, options: Mapping[str, Any]) -> tuple[str, str, int, str, str] | str:
    """``(scheme, host, port, path, query)`` of ``url``, or why the engine cannot connect there."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s):// URL the engine connects to"
    if scheme == "http" and not _true(options.get("allow_http", False)):
        return "plain http:// without allow_http (obstore refuses it too)"
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, parts.hostname, port, parts.path.rstrip("/"), parts.query


def _common(options: dict[str, Any]) -> dict[str, Any]:
    """The :class:`EngineSettings` fields the client options give."""
    idle = options.get("pool_max_idle_per_host")
    return {
        "allow_http": _true(options.get("allow_http", False)),
        "connect_timeout_s": duration_s(options.get("connect_timeout"), OBSTORE_CONNECT_TIMEOUT_S),
        "pool_idle_timeout_s": duration_s(options.get("pool_idle_timeout"), OBSTORE_POOL_IDLE_TIMEOUT_S),
        "max_idle": int(idle) if idle is not None and str(idle).strip().isdigit() else None,
        "user_agent": None if options.get("user_agent") is None else str(options["user_agent"]),
        "root_certificate": options.get("root_certificate"),
    }


def engine_settings(raw: Any) -> EngineSettings | str:
    """The settings the engine reads obstore store ``raw`` with, or a short reason why obstore's client does."""
    if not isinstance(raw, (obstore.store.HTTPStore, obstore.store.S3Store)):
        return f"a {type(raw).__name__}: the engine's client reads HTTP(S) and S3 stores"
    options = _options({str(k): v for k, v in dict(raw.client_options or {}).items()})
    if isinstance(options, str):
        return options
    if isinstance(raw, obstore.store.HTTPStore):
        where = _endpoint(raw.url, options)
        if isinstance(where, str):
            return where
        scheme, host, port, path, query = where
        return EngineSettings(scheme, host, port, path, query, reason=f"an {scheme} store", **_common(options))
    if raw.credential_provider is not None:
        return "credential_provider is set: obstore's credential provider signs"
    settings = _s3_settings({str(k): v for k, v in dict(raw.config or {}).items()}, options)
    if isinstance(settings, str):
        return settings
    if "region" not in settings:
        return "no region (region= or AWS_REGION): obstore picks one"
    region, bucket = settings["region"], settings["bucket"]
    if _true(settings.get("skip_signature", False)):
        keys, how = None, "anonymous S3"
    elif "access_key_id" in settings and "secret_access_key" in settings:
        keys = S3Keys(settings["access_key_id"], settings["secret_access_key"], settings.get("token"), region)
        how = "S3 with static keys"
    else:
        return "no static keys (access_key_id, secret_access_key): obstore's credential chain signs"
    virtual = _true(settings.get("virtual_hosted_style_request", False))
    # as obstore addresses a bucket: a custom endpoint is taken as given when virtual-hosted (it names the
    # bucket already), and has the bucket appended otherwise; AWS's own endpoints name the region
    if "endpoint" in settings:
        endpoint = settings["endpoint"]
    elif virtual:
        endpoint = f"https://{bucket}.s3.{region}.amazonaws.com"
    else:
        endpoint = f"https://s3.{region}.amazonaws.com"
    where = _endpoint(endpoint, options)
    if isinstance(where, str):
        return where
    scheme, host, port, path, _ = where
    if not virtual:
        path = f"{path}/{quote(bucket, safe='')}"
    prefix = str(raw.prefix or "").strip("/")
    if prefix:
        path = f"{path}/{quote(prefix, safe='/~')}"
    return EngineSettings(scheme, host, port, path, "", keys=keys, s3=True, reason=how, **_common(options))
