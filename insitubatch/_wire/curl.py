"""The engine's GETs through libcurl (pycurl's multi interface) on the event loop: an alternative to ``_wire.http``.

:func:`curl_backend` takes the stores ``engine_client.native_backend``
takes (plain HTTP(S); S3 with a region and static keys or
``skip_signature``), plus those whose client options name a proxy
(``curl_config.curl_target`` decides), and returns a :class:`CurlBackend` with the same interface as
``NativeBackend``: ``request(key, byte_range)`` and ``whole(key)`` return a
future for the body (a ``bytearray``), failures come back raw
(``own_retries = False``) as the exception types ``read_policy.classify``
sorts, and bodies over ``fetch.STREAM_OVER_BYTES`` are streamed through
the obstore twin. libcurl brings redirects (at most
``curl_config.MAX_REDIRECTS``), TLS verification, HTTP/2 over TLS, proxies,
connection reuse, connect/read/overall timeouts and SigV4 signing (its
``CURLOPT_AWS_SIGV4``, which signs as ``_wire.sigv4`` does). pycurl is the
optional extra ``insitubatch[curl]``: only importing this module needs it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import quote, urlsplit

import pycurl
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from .backends import WHOLE_OBJECT_END, _ObstoreBackend
from .curl_config import CurlSettings, curl_target
from .curl_multi import CurlDriver

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
    """GETs of one bucket or URL through libcurl on the running loop; ``raw`` (obstore, retry-free) streams large bodies."""

    def __init__(self, raw: Any, base_url: str, settings: CurlSettings) -> None:
        super().__init__(raw, own_retries=False)
        parts = urlsplit(base_url)
        self.base = parts._replace(query="", fragment="").geturl().rstrip("/")
        self.query = f"?{parts.query}" if parts.query else ""  # a signed or tokened URL's, after every key (as obstore)
        self.settings = settings
        self._driver: CurlDriver | None = None
        self._lock = threading.Lock()

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

    def whole(self, key: str) -> asyncio.Future:
        """A plain GET of ``key`` (for an empty object, which a ranged GET cannot name)."""
        return self._get(key, None, None)

    def close(self) -> None:
        """Close the connections and fail the GETs in flight (from any thread); idempotent."""
        with self._lock:
            driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()

    def _get(self, key: str, span: str | None, want: tuple[int, int] | None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        driver = self._driver
        if driver is None or driver.loop is not loop or driver.closed:
            driver = self._adopt(loop)
        return driver.get(f"{self.base}/{quote(key, safe='/~')}", self.query, span, want)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> CurlDriver:
        """Connections live on one loop: a GET from another loop closes the old loop's and opens this one's."""
        with self._lock:
            old, self._driver = self._driver, CurlDriver(loop, self.settings)
            driver = self._driver
        if old is not None:
            old.close()
        return driver


def curl_backend(raw: Any, twin: Any) -> CurlBackend | None:
    """libcurl's client for obstore store ``raw`` (``twin``: its retry-free copy), or None to keep obstore's."""
    target = curl_target(raw)
    if target is None:
        return None
    base_url, settings = target
    return CurlBackend(twin, base_url, settings)
