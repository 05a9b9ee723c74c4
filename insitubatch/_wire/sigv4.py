"""AWS Signature Version 4 for S3 GETs: the headers that authenticate one request with static credentials."""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import quote, unquote

__all__ = ["SigV4"]

# S3 accepts this instead of the body's hash; a GET has no body to hash.
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


class SigV4:
    """Signs GETs for one bucket's credentials and region (the day's signing key is kept)."""

    def __init__(self, access_key_id: str, secret_access_key: str, region: str, token: str | None = None) -> None:
        self.access_key_id = access_key_id
        self.region = region
        self.token = token
        self._secret = secret_access_key
        self._day = ""
        self._key = b""
        self._signed = "host;x-amz-content-sha256;x-amz-date" + (";x-amz-security-token" if token else "")

    def headers(self, host: str, path: str, now: float | None = None, query: str = "") -> str:
        """The signing headers of ``GET path?query`` on ``host`` (both already URI-encoded), as HTTP header lines.

        ``now`` (seconds since the epoch) pins the signing time, for tests.
        """
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        day = stamp[:8]
        if day != self._day:
            self._key = self._signing_key(day)
            self._day = day
        token_line = f"x-amz-security-token:{self.token}\n" if self.token else ""
        canonical = (
            f"GET\n{path}\n{canonical_query(query) if query else ''}\nhost:{host}\nx-amz-content-sha256:{UNSIGNED_PAYLOAD}\nx-amz-date:{stamp}\n"
            f"{token_line}\n{self._signed}\n{UNSIGNED_PAYLOAD}"
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._key, to_sign.encode(), hashlib.sha256).hexdigest()
        lines = (
            f"x-amz-content-sha256: {UNSIGNED_PAYLOAD}\r\nx-amz-date: {stamp}\r\n"
            f"Authorization: AWS4-HMAC-SHA256 Credential={self.access_key_id}/{scope}, "
            f"SignedHeaders={self._signed}, Signature={signature}\r\n"
        )
        if self.token:
            lines += f"x-amz-security-token: {self.token}\r\n"
        return lines

    def _signing_key(self, day: str) -> bytes:
        key = ("AWS4" + self._secret).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return key


def canonical_query(query: str) -> str:
    """A URL's query as SigV4 signs it: each name and value encoded the AWS way, sorted."""
    pairs = []
    for item in query.split("&"):
        if item:
            name, _, value = item.partition("=")
            pairs.append((_aws_quote(name), _aws_quote(value)))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _aws_quote(text: str) -> str:
    return quote(unquote(text), safe="-_.~")
