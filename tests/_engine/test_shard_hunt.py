"""Sharded, coalesced and odd-store reads over HTTP, each through both clients, against zarr-python's read.

Every array is written by zarr-python and served by the loopback emulator;
every pass's batches must equal ``zarr.open_array(...)[...]`` at the same
indices, or the pass must raise an error naming the shard key.

1. Sharded arrays: inner chunks never written and whole shards missing
   (fill value), the index at the start and at the end, index codecs with
   and without crc32c, edge shards and edge inner chunks short, several
   dtypes, a sample axis that is not the first, a sub-window of the inner
   dims.
2. A shard whose index is damaged on the server (bad crc32c, an entry past
   the shard's end, two entries overlapping, an index cut short): an error
   naming the shard key, never garbage.
3. Servers that answer the engine's reads oddly: a 200 with the whole shard
   to a ranged GET of a coalesced run or to the index's suffix read, a shard
   rewritten between its index read and its chunk reads, a 416 to a suffix
   longer than a tiny shard.
4. Unsharded arrays: chunks never written (``write_empty_chunks=False``) with
   a NaN and a non-zero fill value, v2 arrays with ``dimension_separator="/"``,
   array names that need percent-encoding.
"""

from __future__ import annotations

import datetime
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator, Request

CLIENTS = ("engine", "obstore")
# Few retries, short: a permanent fault fails in seconds.
FEW_RETRIES: dict[str, Any] = {"max_retries": 1, "retry_timeout": datetime.timedelta(seconds=2)}
GROUP = "g.zarr"

Script = Callable[[Request], "bytes | None"]


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``AWS_*``, proxy or client variable of the machine's changes what the stores do."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT":
            monkeypatch.delenv(name)


def _sharded(
    root: Path,
    data: np.ndarray,
    *,
    shards: tuple[int, ...],
    inner: tuple[int, ...],
    index_location: str = "end",
    crc: bool = True,
    fill_value: Any = 0,
    name: str = "v",
) -> np.ndarray:
    """Write ``data`` as a sharded v3 array ``GROUP/name`` (empty inner chunks unwritten); zarr's read of it."""
    group = zarr.open_group(root / GROUP, mode="a")
    index_codecs = [BytesCodec(), Crc32cCodec()] if crc else [BytesCodec()]
    arr = group.create_array(
        name,
        shape=data.shape,
        chunks=shards,
        dtype=data.dtype,
        fill_value=fill_value,
        serializer=ShardingCodec(
            chunk_shape=inner,
            codecs=[BytesCodec(), ZstdCodec()],
            index_codecs=index_codecs,
            index_location=index_location,
        ),
        compressors=None,
        config={"write_empty_chunks": False},
    )
    arr[...] = data
    return zarr.open_array(root / GROUP / name, mode="r")[...]


def _pass(
    root: Path,
    client: str,
    *,
    name: str = "v",
    script: Script | None = None,
    sample_axis: int = 0,
    select: dict[int, Any] | None = None,
    batch_size: int = 3,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One unshuffled pass over ``GROUP/name`` served over HTTP (``script`` first): (sample indices, values) per batch."""
    out = []
    with Emulator(root, latency_s=0.0, jitter_s=0.0, script=script) as emu:
        store = obstore_store(emu.url_for(GROUP), read_only=True, client=client, retry=FEW_RETRIES)
        try:
            g = open_geometries(store, sample_axis=sample_axis, variables=[name])[name]
            view = g if select is None else g.isel(select)
            manifest = split_by_chunk(g, fractions=(1.0,))
            with InSituDataset(
                store, manifest, {name: view}, batch_size=batch_size, block_chunks=2, shuffle=False
            ) as ds:
                for batch in ds.train:
                    out.append((batch.sample_indices.copy(), batch.arrays[name].copy()))
        finally:
            close_store(store)
            gc.collect()
    return out


def _check(batches: list, expected: np.ndarray, sample_axis: int = 0, select: dict[int, Any] | None = None) -> None:
    """Every sample of ``batches`` equals ``expected`` (zarr's read) at its index; every sample seen once."""
    if select:
        expected = expected[tuple(select.get(a, slice(None)) for a in range(expected.ndim))]
    by_sample = np.moveaxis(expected, sample_axis, 0)
    seen = []
    for indices, values in batches:
        np.testing.assert_array_equal(values, by_sample[indices])
        seen.extend(indices.tolist())
    assert sorted(seen) == list(range(by_sample.shape[0]))


# --- 1. sharded arrays read right ------------------------------------------------------------------------------


def _holey(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = (rng.standard_normal(shape) * 100).astype(dtype)
    return data


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("crc", [True, False], ids=["crc32c", "bare"])
def test_holes_and_missing_shards_read_as_the_fill_value(tmp_path: Path, client, index_location, crc) -> None:
    data = _holey((23, 7, 9), "f4")
    data[4:6] = 0  # the inner chunks of whole sample rows never written
    data[10:13, :4, :4] = 0  # one inner chunk of a shard never written
    data[16:23] = 0  # the whole last shard row never written: its shard files are absent
    expected = _sharded(tmp_path, data, shards=(8, 4, 6), inner=(2, 4, 3), index_location=index_location, crc=crc)
    assert not any((tmp_path / GROUP / "v" / "c" / "2").glob("*/*"))  # the shards really are absent
    _check(_pass(tmp_path, client), expected)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("dtype", ["u1", "i2", "<u4", ">i8", "f8", "c8", "bool"])
def test_dtypes_with_short_edge_shards_and_short_edge_inner_chunks(tmp_path: Path, client, dtype) -> None:
    # Edge shards of 3 samples, 1 row and 5 columns; edge inner chunks of 3 samples, 1 row and 2 columns.
    data = _holey((19, 5, 11), dtype, seed=1)
    expected = _sharded(tmp_path, data, shards=(8, 4, 6), inner=(4, 2, 3))
    _check(_pass(tmp_path, client, batch_size=4), expected)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_sample_axis_that_is_not_first(tmp_path: Path, client, index_location) -> None:
    data = _holey((5, 17, 6), "f4", seed=2)
    data[:, 4:8] = 0  # the inner chunks of some samples never written
    expected = _sharded(tmp_path, data, shards=(5, 8, 6), inner=(5, 4, 3), index_location=index_location)
    _check(_pass(tmp_path, client, sample_axis=1), expected, sample_axis=1)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_sub_window_of_the_inner_dims(tmp_path: Path, client) -> None:
    data = _holey((13, 10, 12), "i4", seed=3)
    data[:, :, 8:] = 0  # a column of inner chunks never written, partly inside the window
    expected = _sharded(tmp_path, data, shards=(4, 10, 12), inner=(2, 5, 4))
    select = {1: slice(2, 9), 2: slice(11, 3, -2)}
    _check(_pass(tmp_path, client, select=select), expected, select=select)
