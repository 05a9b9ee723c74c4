"""TLS for the engine's connections: verification always on, against the CAs obstore trusts.

obstore's client trusts the system's CAs, or those that ``SSL_CERT_FILE``
and ``SSL_CERT_DIR`` name instead, plus a store's ``root_certificate``
(PEM). OpenSSL's default paths honour the same two variables, so a default
context verifies against what obstore verifies against. Contexts are built
once per combination and shared: loading a CA bundle costs milliseconds.
"""

from __future__ import annotations

import os
import ssl
import threading

__all__ = ["tls_context"]

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
