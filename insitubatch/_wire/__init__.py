"""Between a store key and its bytes on the wire: the engine's own HTTP/1.1 client, S3 signing, obstore's client.

The engine's connections are asyncio protocols on the loop that already runs
a pass's reads: no thread, task or copy per GET (obstore answers each GET
from its own runtime's threads, and those handoffs cost more CPU per GET
than the decode on a fast link). The parts: ``connection`` (one connection:
a GET out, its answer framed and checked), ``chunked`` (a chunked body,
decoded as it arrives), ``pool`` (one origin's kept-alive connections),
``redirects``, ``tls``, ``sigv4``, ``faults`` (one error type per failure),
``engine_client`` (a store's GETs through the pool) and ``backends``
(obstore's client behind the same interface).
"""
