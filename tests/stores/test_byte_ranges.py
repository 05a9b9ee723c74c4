"""One dispatch of zarr's byte requests: every reader built on ``byte_span`` returns what zarr's own store returns."""

from __future__ import annotations

from pathlib import Path

import pytest
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from insitubatch._zarr_compat import sync
from insitubatch.io.sync_get import sync_get
from insitubatch.stores.byte_ranges import ByteSpan, byte_span
from insitubatch.stores.obstore_stores import obstore_store

DATA = bytes(range(256)) * 4  # 1024 bytes, each position distinct within 256
REQUESTS: list[ByteRequest | None] = [
    None,
    RangeByteRequest(0, 10),
    RangeByteRequest(100, 356),
    RangeByteRequest(1000, 2000),  # runs past the end: comes back short
    OffsetByteRequest(0),
    OffsetByteRequest(700),
    SuffixByteRequest(1),
    SuffixByteRequest(300),
    SuffixByteRequest(5000),  # more than the object: all of it
    SuffixByteRequest(0),  # no bytes
]
PROTOTYPE = default_buffer_prototype()


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "0").write_bytes(DATA)
    return tmp_path


def _zarr_reads(directory: Path, byte_range: ByteRequest | None) -> bytes:
    buf = sync(LocalStore(directory, read_only=True).get("c/0", PROTOTYPE, byte_range))
    assert buf is not None
    return buf.to_bytes()


@pytest.mark.parametrize("byte_range", REQUESTS, ids=repr)
def test_every_request_cuts_what_zarr_reads(directory: Path, byte_range: ByteRequest | None) -> None:
    expected = _zarr_reads(directory, byte_range)
    assert byte_span(byte_range).cut(DATA) == expected
    start, stop = byte_span(byte_range).within(len(DATA))
    assert DATA[start:stop] == expected


@pytest.mark.parametrize("byte_range", REQUESTS, ids=repr)
def test_local_files_read_through_the_span_equal_zarr(directory: Path, byte_range: ByteRequest | None) -> None:
    read = sync_get(obstore_store(directory, read_only=True))
    assert read is not None
    got = read("c/0", prototype=PROTOTYPE, byte_range=byte_range)
    assert bytes(got) == _zarr_reads(directory, byte_range)


@pytest.mark.parametrize("byte_range", REQUESTS, ids=repr)
def test_obstore_reads_through_the_span_equal_zarr(directory: Path, byte_range: ByteRequest | None) -> None:
    # a key obstore itself resolves (not a plain path segment) takes obstore's blocking get with the span's options
    (directory / "c" / "odd key").write_bytes(DATA)
    read = sync_get(obstore_store(directory, read_only=True))
    assert read is not None
    got = read("c/odd key", prototype=PROTOTYPE, byte_range=byte_range)
    assert got is not None and got.to_bytes() == _zarr_reads(directory, byte_range)


def test_a_suffix_is_told_apart_from_an_offset() -> None:
    assert byte_span(SuffixByteRequest(0)) == ByteSpan(0, None, True)
    assert byte_span(OffsetByteRequest(0)) == ByteSpan(0) == byte_span(None)
    with pytest.raises(TypeError, match="is not a zarr ByteRequest"):
        byte_span((0, 10))  # type: ignore[arg-type]
