"""The engine's own GETs for plain HTTP(S) stores and S3 buckets with static keys or none.

:func:`native_backend` returns a backend that sends a store's GETs on the
event loop (``_wire.pool``) when ``stores.wire_settings`` finds everything a
request depends on is what this client applies, else ``None`` (obstore's
client keeps the store). Every request carries the store URL's query (a
token), a ``User-Agent`` naming insitubatch, and, for S3, a SigV4
signature. A redirect is followed (``redirects``); where it leads somewhere
the engine cannot go (a host it cannot sign for, a protocol it does not
speak), that read is handed to obstore through the store's retry-free twin.
Reads of every size are the engine's (``streams_large`` is off): obstore's
client cannot read a chunked body for a range, and a large chunk sent
chunked would fail there on every attempt.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from importlib import metadata
from typing import Any
from urllib.parse import quote

from ..stores.byte_ranges import byte_span
from ..stores.wire_settings import EngineSettings, engine_settings
from .backends import WHOLE_OBJECT_END, ObstoreBackend
from .connection import Ask
from .pool import EXIT_WAIT_S, HttpPool
from .redirects import next_hop
from .sigv4 import SigV4
from .tls import tls_context

__all__ = ["USER_AGENT", "NativeBackend", "native_backend"]

# Origins one store's redirects may lead to, each with its own pool; a redirect past them is obstore's.
MAX_REDIRECT_ORIGINS = 8
# Keys obstore's client does not send as written (object_store's Path drops one leading and one trailing "/", and
# refuses an empty, "." or ".." segment and ASCII control characters): such a read is obstore's, which reads another
# object or refuses the key (sent as written, "a/../k" may be read by a server as the other key "k").
_NOT_AS_WRITTEN = re.compile(r"\A/|/\Z|//|(?:\A|/)\.\.?(?:/|\Z)|[\x00-\x1f\x7f]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # (with a few substring tests, a quarter microsecond per ordinary key)
# The characters a key keeps unencoded in a request's path, as obstore's client sends it: for S3, only the unreserved
# ones (SigV4's encoding); for an HTTP store, every printable ASCII character but space " # % < > ? \ ` { } (the
# URL standard's path-segment set: "+", "=", ";", "[" go as they are), so a server that tells "+" from "%2B" reads
# the object obstore reads.
S3_PATH_SAFE = "/~"
HTTP_PATH_SAFE = "/~!$&'()*+,;=:@[]^|"


def _version() -> str:
    try:
        return metadata.version("insitubatch")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


USER_AGENT = f"insitubatch/{_version()}"


def _host_header(scheme: str, host: str, port: int) -> str:
    named = f"[{host}]" if ":" in host else host  # an IPv6 address, as a Host header writes it
    return named if port == (443 if scheme == "https" else 80) else f"{named}:{port}"


class NativeBackend:
    """GETs on the loop for one bucket or URL; ``raw`` (obstore, retry-free) takes what the engine hands over."""

    streams_large = False  # a large body is received here too (chunked or not), not streamed through obstore
    own_retries = False  # failures come back raw: the engine's loop retries them

    def __init__(self, raw: Any, settings: EngineSettings) -> None:
        self.raw = raw
        # obstore's client on the retry-free twin: it takes the reads a redirect leads where this client cannot go
        self.obstore = ObstoreBackend(raw, own_retries=False)
        self.settings = settings
        self._tls = tls_context(settings.root_certificate) if settings.scheme == "https" else None
        self.pool = self._new_pool(settings.scheme, settings.host, settings.port)
        self._pools = {(settings.scheme, settings.host, settings.port): self.pool}
        self.base = settings.path
        self._safe = S3_PATH_SAFE if settings.s3 else HTTP_PATH_SAFE
        self.query = f"?{settings.query}" if settings.query else ""
        keys = settings.keys
        self.signer = (
            None if keys is None else SigV4(keys.access_key_id, keys.secret_access_key, keys.region, keys.token)
        )
        self._signers = {} if self.signer is None else {self.signer.region: self.signer}
        self.host = _host_header(settings.scheme, settings.host, settings.port)
        self._agent = f"User-Agent: {settings.user_agent or USER_AGENT}\r\n"

    def _new_pool(self, scheme: str, host: str, port: int) -> HttpPool:
        s = self.settings
        context = (self._tls or tls_context(s.root_certificate)) if scheme == "https" else None
        return HttpPool(
            scheme,
            host,
            port,
            context,
            connect_timeout_s=s.connect_timeout_s,
            idle_timeout_s=s.pool_idle_timeout_s,
            max_idle=s.max_idle,
        )

    def request(self, key: str, byte_range: Any = None) -> asyncio.Future:
        """A future for ``key``'s bytes (a ``bytearray``), the whole object or ``byte_range`` of it."""
        if byte_range is None:
            return self._get(key, byte_range, f"0-{WHOLE_OBJECT_END - 1}", (0, WHOLE_OBJECT_END))
        start, stop, from_end = byte_span(byte_range)
        if from_end:
            return self._get(key, byte_range, f"-{start}", (-start, 0))
        if stop is None:
            return self._get(key, byte_range, f"{start}-", (start, WHOLE_OBJECT_END))
        return self._get(key, byte_range, f"{start}-{stop - 1}", (start, stop))

    def whole(self, key: str) -> asyncio.Future:
        """A plain GET of ``key`` (for an empty object, which a ranged GET cannot name)."""
        return self._get(key, None, None, None)

    def request_many(self, requests: Sequence[tuple[str, Any]]) -> list[asyncio.Future]:
        """A future per ``(key, byte_range)`` of ``requests``, in order: one loop iteration's reads, sent together."""
        request = self.request
        return [request(key, byte_range) for key, byte_range in requests]

    def versioned(self, key: str, byte_range: Any, version: str) -> asyncio.Future:
        """A future for ``(bytes, etag)`` of ``byte_range`` of ``key``; with a ``version``, sent ``If-Match`` it.

        The server answers 412 (``HttpStatusError``) when the object's ETag is not ``version``.
        """
        start, stop, from_end = byte_span(byte_range)
        if from_end:
            return self._get(key, byte_range, f"-{start}", (-start, 0), version)
        if stop is None:
            return self._get(key, byte_range, f"{start}-", (start, WHOLE_OBJECT_END), version)
        return self._get(key, byte_range, f"{start}-{stop - 1}", (start, stop), version)

    def _get(
        self, key: str, byte_range: Any, span: str | None, want: tuple[int, int] | None, version: str | None = None
    ) -> asyncio.Future:
        if (
            key[:1] in "/." or key[-1:] == "/" or "//" in key or "/." in key or _CONTROL.search(key)
        ) and _NOT_AS_WRITTEN.search(key):
            future = asyncio.get_running_loop().create_future()
            ask = Ask(self, key, byte_range, key, span, want)
            ask.version = version
            self._hand_over(ask, future)
            return future
        path = f"{self.base}/{quote(key, safe=self._safe)}"
        head = f"GET {path}{self.query} HTTP/1.1\r\nHost: {self.host}\r\n{self._agent}"
        if span is not None:
            head += f"Range: bytes={span}\r\n"
        ask = Ask(self, key, byte_range, path, span, want)
        if version is not None:
            ask.version = version
            if version:
                head += f"If-Match: {version}\r\n"
        if self.signer is not None:
            head += self.signer.headers(self.host, path)
        return self.pool.get(f"{head}\r\n".encode(), ask)

    # -- redirects ---------------------------------------------------------------------------------------------
    def redirected(
        self,
        ask: Ask,
        future: asyncio.Future,
        status: int,
        location: str | None,
        region: str | None,
        pool: HttpPool,
    ) -> None:
        """Follow a redirect of ``ask`` (on ``pool``), or hand the read to obstore; ``future`` gets the bytes."""
        ask.hops += 1
        try:
            hop = next_hop(
                pool.origin,
                ask.target,
                location,
                ask.hops,
                status=status,
                region=region,
                home=(self.settings.host, self.settings.port),
                signed_region=None if self.signer is None else self.signer.region,
                allow_http=self.settings.allow_http,
            )
            origin = None if hop is None else (hop.scheme, hop.host, hop.port)
            if hop is None or (origin not in self._pools and len(self._pools) >= MAX_REDIRECT_ORIGINS):
                self._hand_over(ask, future)
                return
            assert origin is not None
            target = self._pools.get(origin) or self._pools.setdefault(origin, self._new_pool(*origin))
            host = _host_header(hop.scheme, hop.host, hop.port)
            head = f"GET {hop.path}{'?' if hop.query else ''}{hop.query} HTTP/1.1\r\nHost: {host}\r\n{self._agent}"
            if ask.span is not None:
                head += f"Range: bytes={ask.span}\r\n"
            if ask.version:
                head += f"If-Match: {ask.version}\r\n"
            if self.signer is not None:
                head += self._signer(hop.region).headers(host, hop.path, query=hop.query)
            ask.target = hop.path
            target.resend(f"{head}\r\n".encode(), future, ask)
        except Exception as exc:  # (a fault here would otherwise be lost in the connection's callback)
            if not future.done():
                future.set_exception(exc)

    def _signer(self, region: str | None) -> SigV4:
        assert self.signer is not None
        if region is None or region == self.signer.region:
            return self.signer
        signer = self._signers.get(region)
        if signer is None:
            keys = self.settings.keys
            assert keys is not None
            signer = self._signers[region] = SigV4(keys.access_key_id, keys.secret_access_key, region, keys.token)
        return signer

    def _hand_over(self, ask: Ask, future: asyncio.Future) -> None:
        """Let obstore's client (the retry-free twin) do this read from the start; its answer sets ``future``."""
        try:
            if ask.version is not None:
                twin = self.obstore.versioned(ask.key, ask.byte_range, ask.version)
            elif ask.span is None:
                twin = self.obstore.whole(ask.key)
            else:
                twin = self.obstore.request(ask.key, ask.byte_range)
        except Exception as exc:  # a key obstore refuses as it is asked (its Path's rules): this read's error
            future.set_exception(exc)
            return

        def landed(twin: asyncio.Future) -> None:
            if future.done():
                return
            if twin.cancelled():
                future.cancel()
            elif twin.exception() is not None:
                future.set_exception(twin.exception())  # type: ignore[arg-type]
            else:
                future.set_result(twin.result())

        twin.add_done_callback(landed)
        future.add_done_callback(lambda f: twin.cancel() if f.cancelled() else None)

    def close(self, wait_s: float = 0.0) -> None:
        """Close the idle connections of every pool (from any thread; ``wait_s``: how long to wait for them)."""
        for pool in list(self._pools.values()):
            pool.close(wait_s=min(wait_s, EXIT_WAIT_S))


def native_backend(raw: Any, twin: Any) -> NativeBackend | None:
    """The loop's own client for obstore store ``raw`` (``twin``: its retry-free copy), or None to keep obstore's."""
    settings = engine_settings(raw)
    return None if isinstance(settings, str) else NativeBackend(twin, settings)
