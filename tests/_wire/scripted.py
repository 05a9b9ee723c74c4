"""What the wire tests share besides their servers: every case runs through each client in ``WIRE_CLIENTS``.

The servers are the emulator (``insitubatch.testing.emulator``): scripted
per request, or serving a directory, started by the ``scripted`` fixture
(``tests/_wire/conftest.py``); S3 with signatures checked is moto's
(``servers.start_s3_server``). Here:

* :func:`read_through` / :func:`read_many`: keys read through the store's
  client the way a pass reads them (``client_for`` + ``Fetcher``), with the
  client chosen by ``obstore_store(..., client=name)``;
"""

from __future__ import annotations

import asyncio
import datetime
import gc
from typing import Any

from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.store_link import client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store

# The clients every differential case runs through; a third is one more name here.
WIRE_CLIENTS = ("engine", "obstore")
# Retries a case allows: enough to see a transient fault retried, few enough to fail in seconds.
FEW_RETRIES: dict[str, Any] = {"max_retries": 2, "retry_timeout": datetime.timedelta(seconds=4)}
# Every wait on a loopback server is bounded by this (a loaded 2-core machine).
WAIT_S = 20.0


def read_through(
    client: str,
    url: str,
    key: str,
    byte_range: Any = None,
    *,
    version: str | None = None,
    counters: PassCounters | None = None,
    **store: Any,
) -> Any:
    """``key`` (``byte_range`` of it) read as a pass reads it, by ``client``; its bytes or the error raised.

    With ``version``, a versioned read (``Fetcher.get_versioned``): its bytes and the ETag the answer named.
    ``counters`` count the read's GETs and retries.
    """
    store.setdefault("retry", FEW_RETRIES)
    opened = obstore_store(url, read_only=True, client=client, **store)
    try:
        reader = client_for(opened)
        assert reader.route.client == client, reader.route
        fetcher = Fetcher(reader, ReadWindow(4).user(4), counters or PassCounters(), hedge=False)

        async def main() -> Any:
            if version is not None:
                return await asyncio.wait_for(fetcher.get_versioned(key, byte_range, version), WAIT_S)
            return await asyncio.wait_for(fetcher.get(key, byte_range), WAIT_S)

        try:
            got = asyncio.run(main())
        except Exception as exc:
            return exc
        if version is not None:
            return None if got[0] is None else got[0].to_bytes(), got[1]
        return None if got is None else got.to_bytes()
    finally:
        close_store(opened)
        gc.collect()  # a socket or transport this read left unclosed warns in this test, not in a later one


def read_many(
    client: str, url: str, reads: list[tuple[str, Any, int | None]], **store: Any
) -> list[bytes | None | BaseException]:
    """``reads`` (key, byte range, size hint) one after another through one store, as a pass reads them, by ``client``.

    Each result is the bytes, ``None`` for a missing key, or the error raised.
    """
    store.setdefault("retry", FEW_RETRIES)
    opened = obstore_store(url, read_only=True, client=client, **store)
    try:
        reader = client_for(opened)
        assert reader.route.client == client, reader.route
        fetcher = Fetcher(reader, ReadWindow(4).user(4), PassCounters(), hedge=False)

        async def one(key: str, byte_range: Any, size_hint: int | None) -> bytes | None | BaseException:
            try:
                got = await asyncio.wait_for(fetcher.get(key, byte_range, size_hint), WAIT_S)
            except Exception as exc:
                return exc
            return None if got is None else got.to_bytes()

        async def main() -> list[bytes | None | BaseException]:
            return [await one(*read) for read in reads]

        return asyncio.run(main())
    finally:
        close_store(opened)
        gc.collect()  # a socket or transport these reads left unclosed warns in this test, not in a later one
