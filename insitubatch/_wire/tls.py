"""TLS for the engine's connections: verification always on, against the CAs obstore trusts.

obstore's client trusts the system's CAs, or those that ``SSL_CERT_FILE``
and ``SSL_CERT_DIR`` name instead, plus a store's ``root_certificate``
(PEM). OpenSSL's default paths honour the same two variables, so a default
context verifies against what obstore verifies against. Contexts are built
once per combination and shared: loading a CA bundle costs milliseconds.

:class:`ResumingContext` offers an origin's last TLS session on each new
connection to it, so a server that closes every connection resumes the
session (an abbreviated handshake, TLS 1.2 session ids and TLS 1.3 tickets
alike) instead of a full one each time, as obstore's client does.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading

__all__ = ["ResumingContext", "tls_context"]

# What obstore and OpenSSL take the trusted CAs from, besides the system's.
CA_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR")

_contexts: dict[tuple[str | None, ...], ssl.SSLContext] = {}
_lock = threading.Lock()


def tls_context(root_certificate: str | bytes | None = None) -> ssl.SSLContext:
    """A verifying client context: the CAs the environment names (or the system's), plus ``root_certificate``."""
    pem = root_certificate.decode() if isinstance(root_certificate, bytes) else root_certificate
    key = (*(os.environ.get(name) for name in CA_ENV), pem)
    with _lock:
        context = _contexts.get(key)
        if context is None:
            context = ssl.create_default_context()  # hostname checked, CERT_REQUIRED, the default (env) CA paths
            if pem:
                context.load_verify_locations(cadata=pem)
            context.set_alpn_protocols(["http/1.1"])
            _contexts[key] = context
    return context


class ResumingContext:
    """One origin's TLS: ``context``'s verification, offering the session kept from the last connection.

    Given to ``loop.create_connection(ssl=...)`` in place of the
    ``SSLContext``: asyncio's TLS protocol calls only :meth:`wrap_bio`.
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.session: ssl.SSLSession | None = None

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return self.context.wrap_bio(incoming, outgoing, server_side, server_hostname, session=session or self.session)

    def keep(self, transport: asyncio.BaseTransport) -> None:
        """Keep ``transport``'s session (after its first answer, when a TLS 1.3 ticket has come) for the next."""
        tls = transport.get_extra_info("ssl_object")
        session = None if tls is None else tls.session
        if session is not None:
            self.session = session
