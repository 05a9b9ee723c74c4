"""The engine's own GETs for plain HTTP(S) stores and S3 buckets with static keys or none.

:func:`native_backend` returns a backend that sends a store's GETs on the
event loop (``_wire.http``), for an obstore ``HTTPStore``, or an ``S3Store``
anonymous (``skip_signature``) or with static keys and a region, taken from
its config or, as obstore takes them, from the ``AWS_*`` environment (the
config first). Anything else a request may depend on (a proxy, custom
headers or certificates, a credential provider or chain, a requester-pays
or SSE-C setting) keeps the obstore client: ``None`` is returned. Bodies
larger than ``fetch.STREAM_OVER_BYTES`` are still streamed through obstore.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any
from urllib.parse import quote, urlsplit

import obstore.store
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from .backends import WHOLE_OBJECT_END, _ObstoreBackend
from .http import HttpPool
from .sigv4 import SigV4

__all__ = ["NativeBackend", "native_backend"]

# Client options that change nothing the engine's requests depend on (timeouts are its own stall timer).
_HARMLESS_OPTIONS = frozenset(
    {"allow_http", "timeout", "connect_timeout", "read_timeout", "pool_idle_timeout", "pool_max_idle_per_host"}
)
_HARMLESS_OPTIONS |= {"http1_only"}
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
    }
)
# obstore's names of the S3 settings this client applies, each to one name.
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
# Environment obstore applies to a GET that this client does not: such a store keeps obstore's client.
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
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


class NativeBackend(_ObstoreBackend):
    """GETs on the loop for one bucket or URL; ``raw`` (obstore, retry-free) streams the large bodies."""

    def __init__(self, raw: Any, scheme: str, host: str, port: int, base: str, signer: SigV4 | None) -> None:
        super().__init__(raw, own_retries=False)
        context = ssl.create_default_context() if scheme == "https" else None
        self.pool = HttpPool(scheme, host, port, context)
        self.base = base.rstrip("/")
        self.signer = signer
        default_port = 443 if scheme == "https" else 80
        named = f"[{host}]" if ":" in host else host  # an IPv6 address, as a Host header writes it
        self.host = named if port == default_port else f"{named}:{port}"

    def request(self, key: str, byte_range: Any = None) -> asyncio.Future:
        """A future for ``key``'s bytes (a ``bytearray``), the whole object or ``byte_range`` of it."""
        if byte_range is None:
            return self._get(key, f"0-{WHOLE_OBJECT_END - 1}", (0, WHOLE_OBJECT_END))
        if isinstance(byte_range, RangeByteRequest):
            start, end = byte_range.start, byte_range.end
            return self._get(key, f"{start}-{end - 1}", (start, end))
        if isinstance(byte_range, OffsetByteRequest):
            return self._get(key, f"{byte_range.offset}-", (byte_range.offset, WHOLE_OBJECT_END))
        if isinstance(byte_range, SuffixByteRequest):
            return self._get(key, f"-{byte_range.suffix}", (-byte_range.suffix, 0))
        raise TypeError(f"byte_range={byte_range!r} is not a zarr ByteRequest")

    def close(self) -> None:
        """Close the idle connections (from any thread)."""
        self.pool.close()

    def whole(self, key: str) -> asyncio.Future:
        """A plain GET of ``key`` (for an empty object, which a ranged GET cannot name)."""
        return self._get(key, None, None)

    def _get(self, key: str, span: str | None, trim: tuple[int, int] | None) -> asyncio.Future:
        path = f"{self.base}/{quote(key, safe='/~')}"
        head = f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if span is not None:
            head += f"Range: bytes={span}\r\n"
        if self.signer is not None:
            head += self.signer.headers(self.host, path)
        return self.pool.get(f"{head}\r\n".encode(), path, trim)


def _s3_settings(config: dict[str, Any], options: dict[str, Any]) -> dict[str, str] | None:
    """What obstore's S3 store will use, from its config and the ``AWS_*`` environment it also reads.

    The config wins over the environment. None when the config holds
    anything else, the environment sets what a GET depends on and this
    client does not apply (``_AWS_NOT_APPLIED``), or two environment names
    of one setting disagree. ``options`` (the client options) gains ``allow_http`` from
    ``AWS_ALLOW_HTTP``.
    """
    if not set(config) <= _S3_KEYS:
        return None
    settings = {_S3_ALIASES.get(k, k): str(v) for k, v in config.items()}
    from_env: dict[str, str] = {}
    for name, value in os.environ.items():
        if not name.startswith("AWS_"):
            continue
        if name in _AWS_NOT_APPLIED:
            return None
        if name == "AWS_ALLOW_HTTP":
            options.setdefault("allow_http", value)
            continue
        key = _S3_ALIASES.get(name[4:].lower())
        if key is None:
            continue  # what does not change a GET (write settings, credential sources: keys come first)
        if from_env.setdefault(key, value) != value:
            return None  # AWS_REGION and AWS_DEFAULT_REGION disagree, say: which one obstore takes is not defined
    for key, value in from_env.items():
        settings.setdefault(key, value)
    return settings


def _allowed(scheme: str, options: dict[str, Any]) -> bool:
    if not set(options) <= _HARMLESS_OPTIONS or any(os.environ.get(name) for name in _PROXY_ENV):
        return False
    return scheme == "https" or (scheme == "http" and _true(options.get("allow_http", False)))


def _split(url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, parts.hostname or "", port, parts.path


def native_backend(raw: Any, twin: Any) -> NativeBackend | None:
    """The loop's own client for obstore store ``raw`` (``twin``: its retry-free copy), or None to keep obstore's."""
    options = {str(k): v for k, v in dict(raw.client_options or {}).items()}
    if isinstance(raw, obstore.store.HTTPStore):
        scheme, host, port, path = _split(raw.url)
        if not host or not _allowed(scheme, options):
            return None
        return NativeBackend(twin, scheme, host, port, path, None)
    if not isinstance(raw, obstore.store.S3Store) or raw.credential_provider is not None:
        return None
    settings = _s3_settings({str(k): v for k, v in dict(raw.config or {}).items()}, options)
    if settings is None or "region" not in settings:
        return None
    region, bucket = settings["region"], settings["bucket"]
    if _true(settings.get("skip_signature", False)):
        signer = None
    elif "access_key_id" in settings and "secret_access_key" in settings:
        keys = settings["access_key_id"], settings["secret_access_key"]
        signer = SigV4(*keys, region, settings.get("token"))
    else:
        return None  # a profile, a role or instance metadata: obstore's credential chain
    endpoint = settings.get("endpoint", f"https://s3.{region}.amazonaws.com")
    scheme, host, port, path = _split(endpoint)
    if not host or not _allowed(scheme, options):
        return None
    if _true(settings.get("virtual_hosted_style_request", False)):
        host = f"{bucket}.{host}"
    else:
        path = f"{path.rstrip('/')}/{quote(bucket, safe='')}"
    prefix = str(raw.prefix or "").strip("/")
    if prefix:
        path = f"{path.rstrip('/')}/{quote(prefix, safe='/~')}"
    return NativeBackend(twin, scheme, host, port, path, signer)
