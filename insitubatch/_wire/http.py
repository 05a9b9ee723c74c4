"""HTTP/1.1 GETs on the event loop itself: kept-alive connections, bodies received straight into their buffer.

obstore answers each GET from its own runtime's threads, and the handoffs
between those threads and Python cost more CPU per GET than the GET's
decode on a fast link (``bench.network``'s ``cpu`` scenario). The engine's
connections are asyncio protocols on the loop that already runs the pass's
reads: no thread, task or copy per GET. The parts: ``connection`` (one
connection: a GET out, its answer framed and checked), ``chunked`` (a
chunked body, decoded as it arrives), ``pool`` (one origin's kept-alive
connections: idle expiry, connect timeout, closing), ``redirects``, ``tls``
and ``faults`` (one error type per failure, sorted by
``read_policy.classify``). This module names the two a caller needs.
"""

from __future__ import annotations

from .faults import HttpStatusError
from .pool import HttpPool

__all__ = ["HttpPool", "HttpStatusError"]
