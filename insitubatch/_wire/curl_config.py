"""Which stores libcurl reads, and the options every GET of one store is sent with.

libcurl reads exactly the stores the engine's own client reads, with the
same settings: :func:`curl_target` takes ``io.wire_settings.engine_settings``
(the store's URL or S3 config, its client options and the ``AWS_*``
environment obstore also reads) and adds what only libcurl applies itself:
the store's ``timeout`` (the whole GET), ``read_timeout`` (no byte for that
long) and ``http1_only``. :meth:`CurlSettings.apply` sets the options on a
fresh easy handle. Redirects are not libcurl's to follow: the backend
follows them by ``redirects.next_hop``, as the engine's client does.
"""

from __future__ import annotations

import math
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io.wire_settings import EngineSettings, duration_s, engine_settings

__all__ = ["CurlSettings", "curl_target"]

# libcurl receives at most this much per socket read (its default is 16 KiB): a compressed chunk of a few
# hundred KiB comes in one or two reads. (It hands the body on in pieces of 16 KiB whatever this is.)
RECEIVE_BUFFER_BYTES = 256 << 10
# obstore's own defaults where a store's client options leave these unset (io.stores sets both for the
# stores it builds): the whole GET, and no byte for this long.
OBSTORE_TIMEOUT_S = 30.0
OBSTORE_READ_TIMEOUT_S = 30.0
# A GET is abandoned when fewer than this many bytes per second arrive for read_timeout seconds: libcurl's
# "low speed" check, the nearest it has to a read timeout (no byte for that long).
IDLE_BYTES_PER_S = 1
# What S3 accepts instead of the body's hash (a GET has none), sent and signed as the engine's SigV4 does.
UNSIGNED_PAYLOAD_HEADER = "x-amz-content-sha256: UNSIGNED-PAYLOAD"


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


@dataclass(frozen=True)
class CurlSettings:
    """Every GET's options for one store: the engine's settings and libcurl's own timeouts."""

    engine: EngineSettings
    timeout_s: float = OBSTORE_TIMEOUT_S
    read_timeout_s: float = OBSTORE_READ_TIMEOUT_S
    http1_only: bool = False
    _trust: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the CA options, made once

    @property
    def origin(self) -> str:
        """``scheme://host:port`` of the store (a literal IPv6 address in brackets)."""
        e = self.engine
        return f"{e.scheme}://{f'[{e.host}]' if ':' in e.host else e.host}:{e.port}"

    def headers(self) -> list[str]:
        """The request headers every GET sends besides libcurl's own (the signed S3 ones)."""
        keys = self.engine.keys
        if keys is None:
            return []
        return [UNSIGNED_PAYLOAD_HEADER] + ([f"x-amz-security-token: {keys.token}"] if keys.token else [])

    def sigv4(self, region: str | None = None) -> str | None:
        """libcurl's ``CURLOPT_AWS_SIGV4`` for ``region`` (the store's when None), or None for unsigned GETs."""
        keys = self.engine.keys
        return None if keys is None else f"aws:amz:{region or keys.region}:s3"

    def apply(self, easy: Any) -> None:
        """Set these options on a fresh ``pycurl.Curl``."""
        import pycurl

        from .engine_client import USER_AGENT

        e = self.engine
        easy.setopt(pycurl.NOSIGNAL, 1)  # no SIGALRM for timeouts: the handle runs on a thread-shared loop
        easy.setopt(pycurl.USERAGENT, e.user_agent or USER_AGENT)
        easy.setopt(pycurl.BUFFERSIZE, RECEIVE_BUFFER_BYTES)
        easy.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, math.ceil(1000 * e.connect_timeout_s)))
        easy.setopt(pycurl.TIMEOUT_MS, max(1, math.ceil(1000 * self.timeout_s)))
        easy.setopt(pycurl.LOW_SPEED_LIMIT, IDLE_BYTES_PER_S)
        easy.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(self.read_timeout_s)))
        easy.setopt(pycurl.MAXAGE_CONN, max(1, math.ceil(e.pool_idle_timeout_s)))
        easy.setopt(pycurl.FOLLOWLOCATION, 0)  # the backend follows redirects (redirects.next_hop)
        easy.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        version = pycurl.CURL_HTTP_VERSION_1_1 if self.http1_only else pycurl.CURL_HTTP_VERSION_2TLS
        easy.setopt(pycurl.HTTP_VERSION, version)
        easy.setopt(pycurl.SSL_VERIFYPEER, 1)
        easy.setopt(pycurl.SSL_VERIFYHOST, 2)
        for option, value in self._ca().items():
            easy.setopt(getattr(pycurl, option), value)
        easy.setopt(pycurl.PROXY, "")  # never the environment's proxy: such a store is obstore's (wire_settings)
        if e.keys is not None:
            easy.setopt(pycurl.AWS_SIGV4, self.sigv4())
            easy.setopt(pycurl.USERNAME, e.keys.access_key_id)
            easy.setopt(pycurl.PASSWORD, e.keys.secret_access_key)
            easy.setopt(pycurl.HTTPHEADER, self.headers())

    def _ca(self) -> dict[str, Any]:
        """The CAs obstore trusts: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` or the system's, plus ``root_certificate``.

        Python's ``ssl`` reads the same two variables (``_wire.tls``); the
        libcurl in pycurl's wheel was built for another distribution's paths,
        so they are given to it explicitly.
        """
        if not self._trust:
            paths = ssl.get_default_verify_paths()
            cafile = paths.cafile if paths.cafile and os.path.isfile(paths.cafile) else None
            pem = self.engine.root_certificate
            if pem:
                extra = pem.encode() if isinstance(pem, str) else bytes(pem)
                bundle = b"" if cafile is None else Path(cafile).read_bytes()
                self._trust["CAINFO_BLOB"] = bundle + b"\n" + extra  # a blob replaces CAINFO: both go in it
            elif cafile is not None:
                self._trust["CAINFO"] = cafile
            if paths.capath and os.path.isdir(paths.capath):
                self._trust["CAPATH"] = paths.capath
        return self._trust


def curl_target(raw: Any) -> CurlSettings | None:
    """libcurl's settings for obstore store ``raw``, or None where the engine's client would not read it either."""
    engine = engine_settings(raw)
    if isinstance(engine, str):
        return None
    options = {str(k): v for k, v in dict(raw.client_options or {}).items()}
    return CurlSettings(
        engine,
        timeout_s=duration_s(options.get("timeout"), OBSTORE_TIMEOUT_S),
        read_timeout_s=duration_s(options.get("read_timeout"), OBSTORE_READ_TIMEOUT_S),
        http1_only=_true(options.get("http1_only", False)),
    )
