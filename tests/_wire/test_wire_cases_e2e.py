"""Issue 44's wire cases in whole passes through the public API, each client: the right batches, or an error at once.

A gateway's HTML error page answered with 200 to a sharded array's ranged
reads is refused (never served as float32 data), naming the key; a chunk
larger than 8 MiB sent with ``Transfer-Encoding: chunked`` is read by the
engine's client, and refused within seconds by obstore's, which cannot read
a chunked body for a range.
"""

from __future__ import annotations

import datetime
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from datasets import BATCH_SIZE, GROUP, check_pass, write_group
from helpers import assert_batch_matches
from scripted import WIRE_CLIENTS
from zarr.errors import ZarrUserWarning

from insitubatch.dataset import InSituDataset
from insitubatch.errors import StoreReadError
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Request, answer, ranged

# Retry bounds that would keep a transient fault going for a minute: a permanent one must not use them.
PATIENT = {"max_retries": 10, "retry_timeout": datetime.timedelta(seconds=60)}


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


# What obstore's HTTP store wants of a GET's answer besides its length (the emulator's own answers carry them).
DATED = b'Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\nETag: "0"\r\n'


def _gateway_page(request: Request) -> bytes | None:
    if "/s/c/" not in request.path or "range" not in request.headers:
        return None
    page = b"<html><head><title>502</title></head><body>upstream timed out, retry later</body></html>"
    return answer(200, page * 8, Content_Type="text/html")  # the sharded array's ranged reads


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_gateway_error_page_with_200_for_a_shards_range_is_refused_naming_the_key(scripted, tmp_path: Path, client):
    data = write_group(tmp_path)
    server = scripted(_gateway_page, root=tmp_path)  # the files, but for the quirk
    store = obstore_store(server.url_for(GROUP), read_only=True, client=client, retry=PATIENT)
    t0 = time.perf_counter()
    try:
        manifest = split_by_chunk(open_geometries(store)["v"], fractions=(0.75, 0.25))
        with (
            InSituDataset(store, manifest, batch_size=BATCH_SIZE, block_chunks=2, shuffle=False) as ds,
            pytest.raises(StoreReadError) as info,
        ):
            for batch in ds.train:
                assert_batch_matches(batch, ds.variables, data)  # (never the page's bytes as data)
    finally:
        close_store(store)
    text = str(info.value)
    assert "array 's'" in text and "key 's/c/" in text and "Range request not supported" in text
    assert time.perf_counter() - t0 < 10  # at once, not after the retry window


# Over fetch.STREAM_OVER_BYTES (8 MiB), stored uncompressed: each chunk's GET carries 9 MiB.
LARGE_SHAPE = (4, 1536, 1536)
LARGE_CHUNKS = (1, 1536, 1536)


def _write_large(root: Path) -> dict[str, np.ndarray]:
    values = np.random.default_rng(3).standard_normal(LARGE_SHAPE, dtype=np.float32)
    group = zarr.open_group(root / GROUP, mode="w")
    group.create_array("v", shape=LARGE_SHAPE, chunks=LARGE_CHUNKS, dtype="float32", compressors=None)[...] = values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(group.store)
    return {"v": values}


def _chunked(root: Path):
    def quirk(request: Request) -> bytes | None:
        if "/v/c/" not in request.path:
            return None
        plain = ranged((root / request.path.lstrip("/")).read_bytes(), request.headers.get("range"))
        plain = plain.replace(b"\r\n", b"\r\n" + DATED, 1)
        head, _, body = plain.partition(b"\r\n\r\n")
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"content-length:")]
        pieces = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 65536]), body[i : i + 65536]) for i in range(0, len(body), 65536)
        )
        return b"\r\n".join([*lines, b"Transfer-Encoding: chunked"]) + b"\r\n\r\n" + pieces + b"0\r\n\r\n"

    return quirk


@pytest.mark.slow
@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_chunks_over_8_mib_sent_chunked_are_read_by_the_engine_or_refused_at_once(scripted, tmp_path: Path, client):
    data = _write_large(tmp_path)
    server = scripted(_chunked(tmp_path), root=tmp_path)
    t0 = time.perf_counter()
    if client == "engine":
        check_pass(server.url_for(GROUP), data, client=client, retry=PATIENT)
        assert sum("/v/c/" in r.path for r in server.requests) > 0
    else:
        with pytest.raises(StoreReadError) as info:
            check_pass(server.url_for(GROUP), data, client=client, retry=PATIENT)
        assert "key 'v/c/" in str(info.value) and "Content-Length" in str(info.value)
    assert time.perf_counter() - t0 < 30
