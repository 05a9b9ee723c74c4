"""Where a redirect leads, and whether the engine may follow it there (bounded hops, signing, S3 regions).

The engine follows a 3xx with ``Location`` as obstore's client does: at
most :data:`MAX_REDIRECTS` hops, relative locations resolved against the
request, a location that is not a URI (a space, a non-ASCII byte) refused.
A signed S3 GET is signed again for where it goes: on the same
host, or on an AWS S3 host (S3's 307 for a young bucket), for the region
the answer names; a redirect elsewhere, to a protocol the engine does not
speak or to plain HTTP on a store that refuses it is handed to obstore
(``None`` from :func:`next_hop`). A 3xx without ``Location`` is S3 saying
the bucket lives in another region: an error naming it.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit

from .faults import RedirectError

__all__ = ["MAX_REDIRECTS", "Hop", "next_hop", "region_of"]

# obstore's HTTP client (reqwest's default redirect policy) follows at most 10 redirects.
MAX_REDIRECTS = 10
# A Location the engine follows: a URI reference (RFC 3986), as obstore's client requires (it follows no other). No
# spaces, controls, non-ASCII or '"<>[]\^`{|}' ('[' and ']' only around an IPv6 host); '%' only before two hex digits.
_URI_REFERENCE = re.compile(
    r"(?:[A-Za-z][A-Za-z0-9+.-]*:)?(?://\[[0-9A-Fa-f:.]+\])?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?#-]|%[0-9A-Fa-f]{2})*"
)
# An S3 host of AWS's, and the region in its name (s3.eu-west-1, s3-eu-west-1, bucket.s3.dualstack.eu-west-1).
_AWS_S3_HOST = re.compile(r"(^|\.)s3([.-]dualstack)?[.-]([a-z0-9-]+)\.amazonaws\.com(\.cn)?$|(^|\.)s3\.amazonaws\.com$")


class Hop(NamedTuple):
    """The next request of a redirected GET: where, and the region it is signed for (``None``: as before)."""

    scheme: str
    host: str
    port: int
    path: str
    query: str
    region: str | None


def region_of(host: str) -> str | None:
    """The region an AWS S3 host names, ``"us-east-1"`` for the global endpoint, ``None`` for another host."""
    match = _AWS_S3_HOST.search(host.lower())
    if match is None:
        return None
    return match.group(3) or "us-east-1"


def next_hop(
    origin: str,
    target: str,
    location: str | None,
    hops: int,
    *,
    status: int,
    region: str | None,
    home: tuple[str, int],
    signed_region: str | None,
    allow_http: bool,
) -> Hop | None:
    """Where GET ``target`` on ``origin`` goes after a ``status`` answer; ``None``: hand the read to obstore.

    ``hops`` counts this redirect; ``region`` is S3's ``x-amz-bucket-region``;
    ``home`` the store's own host and port; ``signed_region`` the region of a
    signed store (``None``: the GET is unsigned).

    Raises
    ------
    RedirectError
        Past :data:`MAX_REDIRECTS`, no ``Location`` (naming S3's region when given), or one that is not a URI.
    """
    if not location:
        if region is not None and region != signed_region:
            raise RedirectError(
                f"GET {target}: status code: {status}: the bucket is in region {region!r}"
                + (f", not {signed_region!r}" if signed_region else "")
                + f"; open the store with region={region!r}",
                region=region,
            )
        raise RedirectError(f"GET {target}: status code: {status} without a Location to follow")
    if hops > MAX_REDIRECTS:
        raise RedirectError(f"GET {target}: more than {MAX_REDIRECTS} redirects (the last to {_shown(location)})")
    location = location.strip()
    if _URI_REFERENCE.fullmatch(location) is None:
        raise RedirectError(
            f"GET {target}: status code: {status} to Location {_shown(location)!r}, not a URI (RFC 3986): not "
            "followed (obstore's client does not follow it either)"
        )
    parts = urlsplit(urljoin(f"{origin}{target}", location))
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname or (scheme == "http" and not allow_http):
        return None
    port = parts.port or (443 if scheme == "https" else 80)
    hop_region = None
    if signed_region is not None and (parts.hostname, port) != home:
        hop_region = region or region_of(parts.hostname)
        if hop_region is None:
            return None  # not AWS: no credentials go there, obstore's client follows it unsigned
    return Hop(scheme, parts.hostname, port, parts.path or "/", parts.query, hop_region)


def _shown(location: str) -> str:
    """A location for a message: without its query (it may carry a token)."""
    return location.split("?", 1)[0]
