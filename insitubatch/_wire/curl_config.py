"""Which stores libcurl reads, and the options every GET of one store shares.

:func:`curl_target` reads an obstore store once (its URL or S3 config,
client options and the ``AWS_*`` environment obstore also reads, the config
first) and returns the base URL its keys are appended to and the
:class:`CurlSettings` (timeouts, connection idle time, HTTP/1.1 only, a
proxy, SigV4 keys), or None where obstore's client must keep the store: a
credential provider or chain, requester pays, SSE-C, a proxy from the
environment, custom headers or certificates, GCS, Azure (the same stores
``engine_client`` leaves to obstore, less those that name a proxy).
:meth:`CurlSettings.apply` sets the options on a fresh easy handle. Nothing
here imports ``pycurl`` until a handle is set up, so the choice is tested
without it.
"""

from __future__ import annotations

import math
import os
import re
import ssl
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import obstore.store

__all__ = ["CurlSettings", "Signing", "curl_target", "seconds"]

# Redirects followed per GET: reqwest's (obstore's HTTP client's) default limit.
MAX_REDIRECTS = 10
# libcurl receives at most this much per write callback (its default is 16 KiB): a compressed chunk of a
# few hundred KiB arrives in a few callbacks instead of dozens. libcurl allows up to 10 MiB.
RECEIVE_BUFFER_BYTES = 256 << 10
# Connections idle longer than this are not reused: reqwest's default pool idle timeout.
DEFAULT_POOL_IDLE_S = 90.0
# obstore's own defaults, used where a store's client options leave a timeout unset (see io.stores).
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 30.0
# A GET is abandoned when fewer than this many bytes per second arrive for read_timeout seconds: libcurl's
# "low speed" check, the nearest it has to a read timeout (no byte for that long).
IDLE_BYTES_PER_S = 1
USER_AGENT = "insitubatch (libcurl)"
# What S3 accepts instead of the body's hash (a GET has none); signed as a header, as obstore does.
UNSIGNED_PAYLOAD_HEADER = "x-amz-content-sha256: UNSIGNED-PAYLOAD"

# Client options libcurl applies here, or that change nothing a GET sends (the engine times stalls itself).
_OPTIONS = frozenset(
    {
        "allow_http",
        "timeout",
        "connect_timeout",
        "read_timeout",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "http1_only",
        "proxy_url",
        "proxy_excludes",
    }
)
# A proxy from the environment is obstore's to apply (as for engine_client): such a store keeps obstore's client.
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
# An S3 config's keys this client applies, by each of obstore's names (config keys and AWS_* names alike).
_S3_NAMES = {
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
# Environment obstore applies to a GET and this client does not: such a store keeps obstore's client.
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

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|mins|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0, "h": 3600.0, None: 1.0}


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def seconds(value: Any, default: float) -> float:
    """A duration from a ``timedelta``, a number of seconds or an obstore string ("30s", "500ms", "2min")."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and (match := _DURATION.match(value)):
        return float(match.group(1)) * _UNIT_S[match.group(2)]
    return default


@dataclass(frozen=True)
class Signing:
    """Static S3 credentials and a region, for libcurl's own SigV4 (the same signature as ``_wire.sigv4``)."""

    access_key_id: str
    secret_access_key: str
    region: str
    token: str | None = None


@dataclass(frozen=True)
class CurlSettings:
    """Every GET's options for one store."""

    https: bool
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    pool_idle_s: float = DEFAULT_POOL_IDLE_S
    http1_only: bool = False
    allow_http: bool = False
    proxy: str | None = None
    no_proxy: str | None = None
    signing: Signing | None = None

    @classmethod
    def from_options(cls, https: bool, options: dict[str, Any], signing: Signing | None = None) -> CurlSettings:
        """The settings a store's client options give (its unset ones: obstore's defaults)."""
        return cls(
            https=https,
            connect_timeout_s=seconds(options.get("connect_timeout"), DEFAULT_CONNECT_TIMEOUT_S),
            timeout_s=seconds(options.get("timeout"), DEFAULT_TIMEOUT_S),
            read_timeout_s=seconds(options.get("read_timeout"), DEFAULT_READ_TIMEOUT_S),
            pool_idle_s=seconds(options.get("pool_idle_timeout"), DEFAULT_POOL_IDLE_S),
            http1_only=_true(options.get("http1_only", False)),
            allow_http=_true(options.get("allow_http", False)),
            proxy=None if options.get("proxy_url") is None else str(options["proxy_url"]),
            no_proxy=None if options.get("proxy_excludes") is None else str(options["proxy_excludes"]),
            signing=signing,
        )

    def headers(self) -> list[str]:
        """The request headers every GET sends besides libcurl's own (the signed S3 ones)."""
        if self.signing is None:
            return []
        lines = [UNSIGNED_PAYLOAD_HEADER]
        if self.signing.token:
            lines.append(f"x-amz-security-token: {self.signing.token}")
        return lines

    def apply(self, easy: Any) -> None:
        """Set these options on a fresh ``pycurl.Curl``."""
        import pycurl

        easy.setopt(pycurl.NOSIGNAL, 1)  # no SIGALRM for timeouts: the handle runs on a thread-shared loop
        easy.setopt(pycurl.USERAGENT, USER_AGENT)
        easy.setopt(pycurl.BUFFERSIZE, RECEIVE_BUFFER_BYTES)
        easy.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, math.ceil(1000 * self.connect_timeout_s)))
        easy.setopt(pycurl.TIMEOUT_MS, max(1, math.ceil(1000 * self.timeout_s)))
        easy.setopt(pycurl.LOW_SPEED_LIMIT, IDLE_BYTES_PER_S)
        easy.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(self.read_timeout_s)))
        easy.setopt(pycurl.MAXAGE_CONN, max(1, math.ceil(self.pool_idle_s)))
        easy.setopt(pycurl.FOLLOWLOCATION, 1)
        easy.setopt(pycurl.MAXREDIRS, MAX_REDIRECTS)
        # only http(s) at all, and a redirect never leaves TLS unless the store allows plain HTTP
        both = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS
        easy.setopt(pycurl.PROTOCOLS, both)
        easy.setopt(pycurl.REDIR_PROTOCOLS, both if self.allow_http or not self.https else pycurl.PROTO_HTTPS)
        easy.setopt(
            pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1 if self.http1_only else pycurl.CURL_HTTP_VERSION_2TLS
        )
        easy.setopt(pycurl.SSL_VERIFYPEER, 1)
        easy.setopt(pycurl.SSL_VERIFYHOST, 2)
        _trust(easy)
        # a proxy only where the store names one: the environment's are obstore's to apply (engine_client too)
        easy.setopt(pycurl.PROXY, self.proxy or "")
        if self.no_proxy is not None:
            easy.setopt(pycurl.NOPROXY, self.no_proxy)
        if self.signing is not None:
            easy.setopt(pycurl.AWS_SIGV4, f"aws:amz:{self.signing.region}:s3")
            easy.setopt(pycurl.USERNAME, self.signing.access_key_id)
            easy.setopt(pycurl.PASSWORD, self.signing.secret_access_key)
        headers = self.headers()
        if headers:
            easy.setopt(pycurl.HTTPHEADER, headers)


def _trust(easy: Any) -> None:
    """The certificates Python's ``ssl`` trusts (``SSL_CERT_FILE``/``SSL_CERT_DIR`` included), not the wheel's path.

    The libcurl inside pycurl's wheel was built for another distribution's
    certificate path; the engine's own client trusts what ``ssl`` does, so this one does too.
    """
    import pycurl

    paths = ssl.get_default_verify_paths()
    if paths.cafile and os.path.isfile(paths.cafile):
        easy.setopt(pycurl.CAINFO, paths.cafile)
    if paths.capath and os.path.isdir(paths.capath):
        easy.setopt(pycurl.CAPATH, paths.capath)


def _s3_config(config: dict[str, Any], options: dict[str, Any]) -> dict[str, str] | None:
    """The S3 settings obstore will use: the config's, then the ``AWS_*`` environment's; None if any is not applied.

    ``options`` gains ``allow_http`` from ``AWS_ALLOW_HTTP``, as obstore takes it.
    """
    settings: dict[str, str] = {}
    for key, value in config.items():
        name = _S3_NAMES.get(key)
        if name is None:
            return None  # requester pays, SSE-C, checksums, a conditional put, ...: obstore's client
        settings[name] = str(value)
    from_env: dict[str, str] = {}
    for key, value in os.environ.items():
        if not key.startswith("AWS_"):
            continue
        if key in _AWS_NOT_APPLIED:
            return None
        if key == "AWS_ALLOW_HTTP":
            options.setdefault("allow_http", value)
            continue
        name = _S3_NAMES.get(key[4:].lower())
        if name is not None and from_env.setdefault(name, value) != value:
            return None  # two names of one setting disagree (AWS_REGION, AWS_DEFAULT_REGION): obstore's pick is not defined
    for name, value in from_env.items():
        settings.setdefault(name, value)
    return settings


def _origin(url: str) -> tuple[str, str, str]:
    """``(scheme, "scheme://host[:port]", "path[?query]")`` of ``url``; the origin empty when it names no host."""
    parts = urlsplit(url)
    if not parts.hostname:
        return parts.scheme.lower(), "", ""
    scheme = parts.scheme.lower()
    return (
        scheme,
        f"{scheme}://{parts.netloc.rpartition('@')[2]}",
        parts.path + (f"?{parts.query}" if parts.query else ""),
    )


def _allowed(scheme: str, options: dict[str, Any]) -> bool:
    if not set(options) <= _OPTIONS or any(os.environ.get(name) for name in _PROXY_ENV):
        return False
    return scheme == "https" or (scheme == "http" and _true(options.get("allow_http", False)))


def curl_target(raw: Any) -> tuple[str, CurlSettings] | None:
    """``(base URL, settings)`` for libcurl's GETs of obstore store ``raw``, or None to keep obstore's client."""
    options = {str(k): v for k, v in dict(raw.client_options or {}).items()}
    if isinstance(raw, obstore.store.HTTPStore):
        scheme, origin, rest = _origin(raw.url)
        if not origin or not _allowed(scheme, options):
            return None
        return origin + rest, CurlSettings.from_options(scheme == "https", options)
    if not isinstance(raw, obstore.store.S3Store) or raw.credential_provider is not None:
        return None
    s3 = _s3_config({str(k): v for k, v in dict(raw.config or {}).items()}, options)
    if s3 is None or "region" not in s3 or "bucket" not in s3:
        return None
    region, bucket = s3["region"], s3["bucket"]
    signing: Signing | None = None
    if not _true(s3.get("skip_signature", False)):
        if "access_key_id" not in s3 or "secret_access_key" not in s3:
            return None  # a profile, a role or instance metadata: obstore's credential chain
        signing = Signing(s3["access_key_id"], s3["secret_access_key"], region, s3.get("token"))
    scheme, origin, path = _origin(s3.get("endpoint", f"https://s3.{region}.amazonaws.com"))
    if not origin or not _allowed(scheme, options):
        return None
    path = path.split("?", 1)[0].rstrip("/")
    if _true(s3.get("virtual_hosted_style_request", False)):
        origin = f"{scheme}://{quote(bucket, safe='')}.{origin.split('://', 1)[1]}"
    else:
        path = f"{path}/{quote(bucket, safe='')}"
    prefix = str(raw.prefix or "").strip("/")
    if prefix:
        path = f"{path}/{quote(prefix, safe='/~')}"
    return origin + path, CurlSettings.from_options(scheme == "https", options, signing)
