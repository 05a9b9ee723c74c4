"""The zarr compatibility layer: each internal it reaches works on the installed zarr, or fails by name."""

from __future__ import annotations

import asyncio

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.codecs import numcodecs as zn
from zarr.storage import MemoryStore, WrapperStore

from insitubatch import _zarr_compat as compat


def test_installed_zarr_is_in_the_tested_range() -> None:
    installed = tuple(int(p) for p in zarr.__version__.split(".")[:2])
    assert compat.TESTED_ZARR[0] <= installed <= compat.TESTED_ZARR[-1]


def test_sync_runs_on_the_io_loop() -> None:
    async def running() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert compat.sync(running()) is compat.io_loop()
    assert compat.io_loop().is_running()


def test_a_vanished_internal_names_the_zarr_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import zarr.core.sync

    monkeypatch.delattr(zarr.core.sync, "_get_loop")
    with pytest.raises(RuntimeError, match=rf"_get_loop.*zarr {zarr.__version__} does not have.*zarr>=3\.1,<3\.5"):
        compat.io_loop()


def test_chunk_spec_is_the_spec_zarr_encoded_with(tmp_path) -> None:
    arr = zarr.create_array(tmp_path / "a.zarr", shape=(9, 4), chunks=(4, 4), dtype=">i4", fill_value=7)
    spec = compat.chunk_spec(arr.metadata, (4, 4), compat.ArrayConfig(order="C", write_empty_chunks=False), None)
    assert spec.shape == (4, 4) and spec.dtype == arr.metadata.dtype and spec.fill_value == 7


@pytest.mark.filterwarnings("ignore::zarr.errors.ZarrUserWarning")  # numcodecs wrappers are outside the v3 spec
def test_codec_decoder_runs_native_and_wrapped_codecs() -> None:
    raw = np.arange(12, dtype="u1")
    config = compat.ArrayConfig(order="C", write_empty_chunks=False)
    spec = compat.ArraySpec(
        shape=(12,), dtype=zarr.dtype.UInt8(), fill_value=0, config=config, prototype=zarr.buffer.cpu.buffer_prototype
    )
    native = compat.codec_decoder(ZstdCodec())
    np.testing.assert_array_equal(native(np.frombuffer(numcodecs.Zstd().encode(raw), "u1"), spec), raw)
    wrapped = zn.Zlib(level=1)
    assert isinstance(compat.wrapped_numcodec(wrapped), numcodecs.Zlib)
    assert compat.wrapped_numcodec(ZstdCodec()) is None
    decode = compat.codec_decoder(wrapped)
    np.testing.assert_array_equal(decode(np.frombuffer(numcodecs.Zlib(1).encode(raw), "u1"), spec), raw)


def test_codec_without_a_sync_decode_is_a_type_error() -> None:
    class AsyncOnly(zarr.abc.codec.BytesBytesCodec):
        is_fixed_size = True

        async def _decode_single(self, chunk_bytes, chunk_spec):  # pragma: no cover - never called
            return chunk_bytes

        async def _encode_single(self, chunk_bytes, chunk_spec):  # pragma: no cover - never called
            return chunk_bytes

        def compute_encoded_size(self, input_byte_length, chunk_spec):  # pragma: no cover
            return input_byte_length

    with pytest.raises(TypeError, match=rf"AsyncOnly.*no synchronous decode.*zarr {zarr.__version__}"):
        compat.codec_decoder(AsyncOnly())


@pytest.mark.parametrize("location", ["start", "end"])
def test_shard_index_location_on_every_zarr_line(location: str) -> None:
    codec = ShardingCodec(chunk_shape=(2,), codecs=[BytesCodec()], index_location=location)
    assert compat.shard_index_at_start(codec) is (location == "start")


def test_unwrap_store_and_memory_dict() -> None:
    inner = MemoryStore()
    wrapped = WrapperStore(WrapperStore(inner))
    assert compat.unwrap_store(wrapped) is inner
    assert compat.unwrap_store(inner) is inner
    zarr.create_array(inner, name="a", shape=(3,), dtype="u1")
    assert "a/zarr.json" in compat.memory_store_dict(inner)
