"""The engine's GETs through libcurl (pycurl's multi interface) on the event loop: an alternative wire to ``_wire.pool``.

:func:`curl_backend` takes the stores ``engine_client.native_backend``
takes, with the same settings (``curl_config.curl_target``), and returns
a :class:`CurlBackend` with ``NativeBackend``'s interface and behaviour:
``request(key, byte_range)`` and ``whole(key)`` return a future for the
body (a ``bytearray``); failures come back raw (``own_retries = False``)
as the fault types of ``faults``, which ``read_policy.classify`` sorts;
redirects are followed by ``redirects.next_hop`` (bounded hops, S3 signed
again for the region it names), and a read it will not follow is handed to
the obstore twin, which also streams the bodies over
``fetch.STREAM_OVER_BYTES``. libcurl brings the connections (reuse, idle
expiry, HTTP/2 over TLS), TLS verification, the connect/read/overall
timeouts and SigV4 (``CURLOPT_AWS_SIGV4``, the signature ``_wire.sigv4``
makes). pycurl is the optional extra ``insitubatch[curl]``: only importing
this module needs it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import quote

import pycurl
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from .backends import WHOLE_OBJECT_END, _ObstoreBackend
from .connection import Ask
from .curl_config import CurlSettings, curl_target
from .curl_multi import CurlDriver
from .curl_transfer import Redirect
from .faults import RedirectError
from .redirects import next_hop

__all__ = ["CurlBackend", "curl_backend"]

# The oldest libcurl with every option this client sets: CURLOPT_AWS_SIGV4 came in 7.75.0 (as libcurl's
# packed version number, 0xXXYYZZ).
MIN_LIBCURL = 0x074B00
if pycurl.version_info()[2] < MIN_LIBCURL:
    raise ImportError(
        f"insitubatch's libcurl client needs libcurl >= 7.75.0; {pycurl.version} has an older one: "
        "pip install 'insitubatch[curl]' (pycurl >= 7.45.6, whose wheels bundle libcurl 8)"
    )


class CurlBackend(_ObstoreBackend):
    """GETs of one bucket or URL through libcurl on the running loop; ``raw`` (obstore, retry-free) takes the rest."""

    def __init__(self, raw: Any, settings: CurlSettings) -> None:
        super().__init__(raw, own_retries=False)
        self.settings = settings
        self.origin = settings.origin
        self.path = settings.engine.path
        self.query = f"?{settings.engine.query}" if settings.engine.query else ""  # a token's, on every GET
        self._driver: CurlDriver | None = None
        self._lock = threading.Lock()

    def request(self, key: str, byte_range: Any = None) -> asyncio.Future:
        """A future for ``key``'s bytes (a ``bytearray``), the whole object or ``byte_range`` of it."""
        if byte_range is None:
            return self._get(key, None, f"0-{WHOLE_OBJECT_END - 1}", (0, WHOLE_OBJECT_END))
        if isinstance(byte_range, RangeByteRequest):
            start, end = byte_range.start, byte_range.end
            return self._get(key, byte_range, f"{start}-{end - 1}", (start, end))
        if isinstance(byte_range, OffsetByteRequest):
            return self._get(key, byte_range, f"{byte_range.offset}-", (byte_range.offset, WHOLE_OBJECT_END))
        if isinstance(byte_range, SuffixByteRequest):
            return self._get(key, byte_range, f"-{byte_range.suffix}", (-byte_range.suffix, 0))
        raise TypeError(f"byte_range={byte_range!r} is not a zarr ByteRequest")

    def whole(self, key: str) -> asyncio.Future:
        """A plain GET of ``key`` (for an empty object, which a ranged GET cannot name)."""
        return self._get(key, None, None, None)

    def close(self, wait_s: float = 0.0) -> None:
        """Close the connections and fail the GETs in flight, from any thread; idempotent.

        From another thread than the loop's, ``wait_s`` > 0 waits that long for the loop to close the sockets.
        """
        with self._lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.close(wait_s)

    def _get(self, key: str, byte_range: Any, span: str | None, want: tuple[int, int] | None) -> asyncio.Future:
        path = f"{self.path}/{quote(key, safe='/~')}"
        ask = Ask(self, key, byte_range, path, span, want)
        return self._on_loop().get(f"{self.origin}{path}{self.query}", self.origin, ask)

    def _on_loop(self) -> CurlDriver:
        """This loop's driver: connections live on one loop, so a GET from another loop closes the old loop's."""
        loop = asyncio.get_running_loop()
        driver = self._driver
        if driver is not None and driver.loop is loop and not driver.closed:
            return driver
        with self._lock:
            old, self._driver = self._driver, CurlDriver(loop, self.settings, self._redirected)
            driver = self._driver
        if old is not None:
            old.close()
        return driver

    # -- redirects ---------------------------------------------------------------------------------------------
    def _redirected(self, ask: Ask, origin: str, future: asyncio.Future, redirect: Redirect) -> None:
        """Follow a redirect as the engine's client does (``redirects.next_hop``), or hand the read to obstore."""
        engine = self.settings.engine
        ask.hops += 1
        try:
            hop = next_hop(
                origin,
                ask.target,
                redirect.location,
                ask.hops,
                status=redirect.status,
                region=redirect.region,
                home=(engine.host, engine.port),
                signed_region=None if engine.keys is None else engine.keys.region,
                allow_http=engine.allow_http,
            )
        except RedirectError as exc:
            future.set_exception(exc)
            return
        if hop is None:
            self._hand_over(ask, future)
            return
        named = f"[{hop.host}]" if ":" in hop.host else hop.host
        there = f"{hop.scheme}://{named}:{hop.port}"
        ask.target = hop.path
        url = f"{there}{hop.path}{'?' if hop.query else ''}{hop.query}"
        self._on_loop().get(url, there, ask, future, region=hop.region)

    def _hand_over(self, ask: Ask, future: asyncio.Future) -> None:
        """Let obstore's client (the retry-free twin) do this read from the start; its answer sets ``future``."""
        twin = super().whole(ask.key) if ask.span is None else super().request(ask.key, ask.byte_range)

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


def curl_backend(raw: Any, twin: Any) -> CurlBackend | None:
    """libcurl's client for obstore store ``raw`` (``twin``: its retry-free copy), or None to keep obstore's."""
    settings = curl_target(raw)
    return None if settings is None else CurlBackend(twin, settings)
