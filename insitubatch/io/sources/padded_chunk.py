"""``PaddedChunk``: one store's chunk re-encoded as a longer chunk of another, its extra rows the fill value.

xarray writes a year as one time chunk by default: 1464 six-hourly steps in
2020, 1460 in 2021. ``concat_stores`` serves such years as one virtual array
whose chunk is the longest (1464): a shorter year's chunk becomes one virtual
chunk, decoded with its own store's codecs, padded along the concatenated
axis with the fill value (rows no store holds, which no pass draws) and
encoded with the virtual array's codecs. One stored chunk is still one
virtual chunk, fetched once; zarr's own codec pipeline does both conversions.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.api.asynchronous import open_array
from zarr.core.buffer import default_buffer_prototype

from ..._zarr_compat import scratch_store, sync

__all__ = ["PaddedChunk"]


def _one_chunk_store(metadata: Any, chunk_shape: tuple[int, ...]) -> tuple[Any, MutableMapping[str, Any], str]:
    """A memory store holding ``metadata``'s documents for an array of exactly one chunk, its mapping, and
    that chunk's key."""
    meta = metadata.update_shape(chunk_shape)
    store, contents = scratch_store(dict(meta.to_buffer_dict(default_buffer_prototype())))
    return store, contents, meta.encode_chunk_key((0,) * len(chunk_shape))


@dataclass(frozen=True, eq=False)
class PaddedChunk:
    """Converts stored chunks of ``source`` (shape ``source_chunk``) to chunks of ``target`` (``target_chunk``).

    The two differ only along ``axis``, where the source chunk is shorter.
    """

    source: Any  # zarr array metadata of the member store's array
    source_chunk: tuple[int, ...]
    target: Any  # zarr array metadata of the virtual array
    target_chunk: tuple[int, ...]
    axis: int

    async def convert(self, raw: bytes) -> bytes | None:
        """The target chunk holding stored chunk ``raw``; ``None`` when it is all fill value (zarr stores none)."""
        store, contents, key = _one_chunk_store(self.source, self.source_chunk)
        contents[key] = default_buffer_prototype().buffer.from_bytes(raw)
        block = np.asarray(await (await open_array(store=store, mode="r")).getitem(...))
        out, out_contents, out_key = _one_chunk_store(self.target, self.target_chunk)
        pad = [(0, 0)] * block.ndim
        pad[self.axis] = (0, self.target_chunk[self.axis] - self.source_chunk[self.axis])
        fill = self.target.fill_value
        padded = np.pad(block, pad, constant_values=fill if fill is not None else 0)
        await (await open_array(store=out, mode="r+")).setitem(..., padded)
        encoded = out_contents.get(out_key)
        return None if encoded is None else bytes(encoded.to_bytes())

    def __call__(self, raw: bytes) -> bytes | None:
        """:meth:`convert`, from a thread outside zarr's event loop (the engine's decode threads)."""
        return sync(self.convert(raw))
