"""The engine's own GETs for plain HTTP(S) stores and S3 buckets whose config says everything a request needs.

:func:`native_backend` returns a backend that sends a store's GETs on the
event loop (``http_wire``), for an obstore ``HTTPStore``, or an ``S3Store``
anonymous (``skip_signature``) or with static keys, built with an explicit
``region`` (and ``endpoint``, unless the environment names none). Anything
else a request may depend on (a proxy, custom headers or certificates, a
credential provider, keys or endpoints obstore would take from the
environment) keeps the obstore client: ``None`` is returned. Bodies larger
than ``fetch.STREAM_OVER_BYTES`` are still streamed through obstore.
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
from .http_wire import HttpPool
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
    config = {str(k): v for k, v in dict(raw.config or {}).items()}
    if not set(config) <= _S3_KEYS or "region" not in config:
        return None
    env_decides = ("AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
    if "endpoint" not in config and any(os.environ.get(name) for name in env_decides):
        return None
    region, bucket = str(config["region"]), str(config["bucket"])
    if _true(config.get("skip_signature", False)):
        signer = None
    elif "access_key_id" in config and "secret_access_key" in config:
        token = config.get("session_token", config.get("token"))
        keys = str(config["access_key_id"]), str(config["secret_access_key"])
        signer = SigV4(*keys, region, None if token is None else str(token))
    else:
        return None  # keys from the environment, a profile or instance metadata: obstore's credential chain
    endpoint = str(config.get("endpoint", f"https://s3.{region}.amazonaws.com"))
    scheme, host, port, path = _split(endpoint)
    if not host or not _allowed(scheme, options):
        return None
    if _true(config.get("virtual_hosted_style_request", False)):
        host = f"{bucket}.{host}"
    else:
        path = f"{path.rstrip('/')}/{quote(bucket, safe='')}"
    prefix = str(raw.prefix or "").strip("/")
    if prefix:
        path = f"{path.rstrip('/')}/{quote(prefix, safe='/~')}"
    return NativeBackend(twin, scheme, host, port, path, signer)
