"""How the engine sends one GET: straight to obstore, or through a zarr store's own ``get``.

Each backend's ``request(key, byte_range)`` returns an asyncio future for
the bytes; ``own_retries`` says whether failures come back raw (the engine's
loop retries them) or already retried. ``versioned(key, byte_range,
version)`` is a read that also returns the object's ETag (``version=""``)
or only answers while the object has ETag ``version`` (``If-Match``): a
future for ``(bytes, etag or None)``. ``engine_client.NativeBackend``, the
engine's own HTTP client, is a third.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import obstore
from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype

from ..stores.byte_ranges import byte_span
from ..stores.obstore_runtime import refuse_dead_obstore

__all__ = ["WHOLE_OBJECT_END", "ObstoreBackend", "StoreBackend"]

# The end of a whole-key range GET: past any object, so the server sends all of it (RFC 9110 clamps it).
WHOLE_OBJECT_END = 1 << 50


class ObstoreBackend:
    """Requests straight to an obstore store (the retry-free twin): each is one asyncio future."""

    # a read over fetch.STREAM_OVER_BYTES streams its body through obstore (per-piece stall timers)
    streams_large = True

    def __init__(self, raw: Any, own_retries: bool = False) -> None:
        self.raw = raw
        self.own_retries = own_retries  # False: failures come back raw, and the engine's loop retries them

    def request(self, key: str, byte_range: Any = None) -> asyncio.Future:
        """A future for ``key``'s bytes (an ``obstore.Bytes``), the whole object or ``byte_range`` of it."""
        # obstore's stubs call these coroutines; they return the runtime's asyncio future (no task, no frame)
        raw = self.raw
        refuse_dead_obstore(raw, key)
        if byte_range is None:
            return cast(asyncio.Future, obstore.get_range_async(raw, key, start=0, end=WHOLE_OBJECT_END))
        start, stop, from_end = byte_span(byte_range)
        if from_end:
            return asyncio.ensure_future(self._suffix(key, start))
        end = WHOLE_OBJECT_END if stop is None else stop
        return cast(asyncio.Future, obstore.get_range_async(raw, key, start=start, end=end))

    def whole(self, key: str) -> asyncio.Future:
        """A plain GET of ``key`` (for an empty object, which a ranged GET cannot name)."""
        refuse_dead_obstore(self.raw, key)
        return asyncio.ensure_future(self._plain(key))

    def open(self, key: str, byte_range: Any = None) -> asyncio.Future:
        """A future for the response to a GET of ``key`` (``byte_range`` of it), resolved at its first byte.

        Its ``stream()`` gives the body piece by piece (the engine streams a large read under its stall timer).
        """
        refuse_dead_obstore(self.raw, key)
        options: Any = _range_option(byte_range)
        return asyncio.ensure_future(obstore.get_async(self.raw, key, options=options or None))

    def versioned(self, key: str, byte_range: Any, version: str) -> asyncio.Future:
        """A future for ``(bytes, etag)`` of ``byte_range`` of ``key``; with a ``version``, only while it is that one.

        obstore raises ``PreconditionError`` when the object's ETag is not ``version``.
        """
        refuse_dead_obstore(self.raw, key)
        return asyncio.ensure_future(self._versioned(key, byte_range, version))

    def request_many(self, requests: Sequence[tuple[str, Any]]) -> list[asyncio.Future]:
        """A future per ``(key, byte_range)`` of ``requests``, in order: one loop iteration's reads, sent together."""
        request = self.request
        return [request(key, byte_range) for key, byte_range in requests]

    async def _versioned(self, key: str, byte_range: Any, version: str) -> tuple[Any, str | None]:
        options: Any = _range_option(byte_range)
        if version:
            options["if_match"] = version
        try:
            result = await obstore.get_async(self.raw, key, options=options or None)
        except obstore.exceptions.NotSupportedError:
            if byte_range is None or not byte_span(byte_range)[2]:
                raise
            return await self._suffix(key, byte_span(byte_range)[0]), None  # (Azure: no suffix ranges, no tag)
        return await result.bytes_async(), result.meta.get("e_tag")

    async def _plain(self, key: str) -> Any:
        return await (await obstore.get_async(self.raw, key)).bytes_async()

    async def _suffix(self, key: str, suffix: int) -> Any:
        try:
            result = await obstore.get_async(self.raw, key, options={"range": {"suffix": suffix}})
            return await result.bytes_async()
        except obstore.exceptions.NotSupportedError:  # Azure has no suffix ranges: the size first
            size = (await obstore.head_async(self.raw, key))["size"]
            return await obstore.get_range_async(self.raw, key, start=max(0, size - suffix), end=size)


def _range_option(byte_range: Any) -> dict[str, Any]:
    """obstore's ``get`` options for ``byte_range`` (none for the whole object)."""
    if byte_range is None:
        return {}
    start, stop, from_end = byte_span(byte_range)
    if from_end:
        return {"range": {"suffix": start}}
    if stop is None:
        return {"range": {"offset": start}}
    return {"range": (start, stop)}


class StoreBackend:
    """Requests through a zarr store's own ``get`` (which retries by its own rules), each a task."""

    own_retries = True

    def __init__(self, store: Store) -> None:
        self.store = store
        self._prototype = default_buffer_prototype()

    def request(self, key: str, byte_range: Any = None) -> asyncio.Future:
        return asyncio.ensure_future(self.store.get(key, prototype=self._prototype, byte_range=byte_range))

    def whole(self, key: str) -> asyncio.Future:
        return self.request(key)

    def versioned(self, key: str, byte_range: Any, version: str) -> asyncio.Future:
        """A future for ``(bytes, None)``: a store's own ``get`` tells no version (so none is ever asked of it)."""
        return asyncio.ensure_future(self._untagged(key, byte_range))

    async def _untagged(self, key: str, byte_range: Any) -> tuple[Any, None]:
        return await self.store.get(key, prototype=self._prototype, byte_range=byte_range), None

    def request_many(self, requests: Sequence[tuple[str, Any]]) -> list[asyncio.Future]:
        """A future per ``(key, byte_range)`` of ``requests``, in order (each a task of the store's ``get``)."""
        return [self.request(key, byte_range) for key, byte_range in requests]
