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
   naming the shard key, never garbage; under ``on_bad_chunk="nan"`` a
   damaged entry is NaN for its inner chunk alone (a 416 included).
3. Servers that answer the engine's reads oddly: a 200 with the whole shard
   to a ranged GET of a coalesced run or to the index's suffix read, a shard
   rewritten between its index read and its chunk reads, a 416 to a suffix
   longer than a tiny shard; long coalesced runs in a shuffled pass, nested
   shards.
4. Unsharded arrays: chunks never written (``write_empty_chunks=False``) with
   a NaN and a non-zero fill value, v2 arrays with ``dimension_separator="/"``,
   array names that need percent-encoding.
"""

from __future__ import annotations

import datetime
import gc
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from servers import S3Server
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

from insitubatch.dataset import InSituDataset
from insitubatch.errors import BadChunkError, InSituError
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.local_files import LocalFiles
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator, Request, answer, ranged

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
    root: Path, client: str, *, script: Script | None = None, **reading: Any
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One unshuffled pass over ``GROUP/name`` served over HTTP (``script`` first): (sample indices, values) per batch.

    ``reading`` goes to ``_read`` (``name``, ``epochs``, ``between``, the dataset's options).
    """
    with Emulator(root, latency_s=0.0, jitter_s=0.0, script=script) as emu:
        store = obstore_store(emu.url_for(GROUP), read_only=True, client=client, retry=FEW_RETRIES)
        try:
            return _read(store, **reading)
        finally:
            close_store(store)
            gc.collect()


def _read(
    store: Any,
    *,
    name: str = "v",
    sample_axis: int = 0,
    select: dict[int, Any] | None = None,
    batch_size: int = 3,
    epochs: int = 1,
    between: Callable[[], None] | None = None,
    **dataset: Any,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``epochs`` unshuffled passes over ``name`` of ``store`` by one dataset (``between()`` after each but the last):
    (sample indices, values) per batch, the epochs one after the other."""
    out = []
    g = open_geometries(store, sample_axis=sample_axis, variables=[name])[name]
    view = g if select is None else g.isel(select)
    manifest = split_by_chunk(g, fractions=(1.0,))
    with InSituDataset(
        store, manifest, {name: view}, batch_size=batch_size, block_chunks=2, **{"shuffle": False, **dataset}
    ) as ds:
        for epoch in range(epochs):
            if epoch:
                assert between is not None
                between()
                ds.set_epoch(epoch)
            for batch in ds.train:
                out.append((batch.sample_indices.copy(), batch.arrays[name].copy()))
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


# --- 2. a damaged index on the server -----------------------------------------------------------------------------

DAMAGED_KEY = "v/c/1/0/0"  # the shard the damage tests break: samples 8 to 15
ENTRIES = 8  # inner chunks per shard of _small (4 x 1 x 2)


def _small(root: Path, index_location: str = "end", crc: bool = True, codecs: str = "zstd") -> np.ndarray:
    """A (16, 4, 6) float32 array of two shards of eight inner chunks each; zarr's read of it."""
    data = np.arange(16 * 4 * 6, dtype="f4").reshape(16, 4, 6)
    return _sharded(root, data, shards=(8, 4, 6), inner=(2, 4, 3), index_location=index_location, crc=crc)


def _damage(shard: Path, kind: str, index_location: str, crc: bool) -> None:
    """Rewrite ``shard``'s index as ``kind`` says (its crc32c recomputed unless the damage is the crc itself)."""
    import google_crc32c

    raw = bytearray(shard.read_bytes())
    n = ENTRIES * 16 + (4 if crc else 0)
    lo = 0 if index_location == "start" else len(raw) - n
    entries = np.frombuffer(bytes(raw[lo : lo + ENTRIES * 16]), "<u8").reshape(ENTRIES, 2).copy()
    if kind == "bad_crc32c":
        raw[lo + 3] ^= 0xFF
    elif kind == "index_cut_short":  # the shard is shorter than its index alone
        raw = raw[-(n - 8) :] if index_location == "end" else raw[:20]
    else:
        if kind == "offset_past_the_end":
            entries[1, 0] = len(raw) + 100
        elif kind == "length_past_the_end":
            entries[1, 1] = len(raw)
        elif kind == "entry_in_the_index":
            entries[1, 0] = len(raw) - 10 if index_location == "end" else 0
        elif kind == "overlapping_pair":
            entries[2] = entries[1]
        elif kind == "out_of_order_pair":
            entries[[1, 2]] = entries[[2, 1]]
        raw[lo : lo + ENTRIES * 16] = entries.tobytes()
        if crc:
            raw[lo + ENTRIES * 16 : lo + n] = google_crc32c.value(bytes(raw[lo : lo + ENTRIES * 16])).to_bytes(
                4, "little"
            )
    shard.write_bytes(bytes(raw))


# (damage, index codecs with crc32c): a bare index has no checksum to break
RAISING = [("bad_crc32c", True)] + [
    (kind, crc)
    for kind in ("index_cut_short", "offset_past_the_end", "length_past_the_end", "entry_in_the_index")
    for crc in (True, False)
]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize(("kind", "crc"), RAISING)
def test_a_damaged_index_raises_naming_the_shard_as_zarr_raises(tmp_path, client, index_location, kind, crc) -> None:
    _small(tmp_path, index_location, crc)
    _damage(tmp_path / GROUP / DAMAGED_KEY, kind, index_location, crc)
    with pytest.raises(Exception):  # noqa: B017, PT011 - zarr raises whatever its codecs raise
        zarr.open_array(tmp_path / GROUP / "v", mode="r")[...]
    with pytest.raises(InSituError, match=f"key '{DAMAGED_KEY}'"):
        _pass(tmp_path, client)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("kind", ["offset_past_the_end", "length_past_the_end", "entry_in_the_index"])
def test_a_damaged_entry_is_a_bad_chunk_of_its_inner_chunk_alone(tmp_path, client, index_location, kind) -> None:
    """With ``on_bad_chunk="nan"`` the entry's inner chunk reads NaN, every other value as zarr read it undamaged.

    An offset past the shard's end is answered 416: the same bad chunk as a length past it, not a store failure.
    """
    expected = _small(tmp_path, index_location).copy()
    _damage(tmp_path / GROUP / DAMAGED_KEY, kind, index_location, True)
    expected[8:10, :, 3:6] = np.nan  # entry 1 of the second shard: inner chunk (0, 0, 1)
    _check(_pass(tmp_path, client, on_bad_chunk="nan"), expected)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("kind", ["overlapping_pair", "out_of_order_pair"])
def test_entries_overlapping_or_out_of_order_read_as_zarr_reads_them(tmp_path, client, index_location, kind) -> None:
    original = _small(tmp_path, index_location)
    _damage(tmp_path / GROUP / DAMAGED_KEY, kind, index_location, True)
    expected = zarr.open_array(tmp_path / GROUP / "v", mode="r")[...]
    assert not np.array_equal(expected, original)  # zarr reads the inner chunks where the index points
    _check(_pass(tmp_path, client), expected)


# --- 3. servers that answer the shard reads oddly ---------------------------------------------------------------

# What obstore's HTTP store wants of an answer besides its length (the emulator's own answers carry them).
DATED = {"Last_Modified": "Mon, 01 Jan 2024 00:00:00 GMT", "ETag": '"0"'}


def _whole_shard(root: Path, ranges: list[str], *, suffix_only: bool = False, content_range: bool = True) -> Script:
    """A script answering ranged GETs of shards with 200 and the whole shard (``ranges`` notes each Range asked)."""

    def script(request: Request) -> bytes | None:
        asked = request.headers.get("range")
        if "/v/c/" not in request.path or asked is None or (suffix_only and "=-" not in asked):
            return None
        ranges.append(asked)
        body = (root / request.path.lstrip("/")).read_bytes()
        extra = {"Content_Range": f"bytes 0-{len(body) - 1}/{len(body)}"} if content_range else {}
        return answer(200, body, **DATED, **extra)

    return script


def _coalesced(root: Path, index_location: str) -> np.ndarray:
    """Sample chunks of four inner chunks each, some never written: runs of several inner chunks, and gaps."""
    data = _holey((16, 4, 12), "f4", seed=4)
    data[0:2, :, 3:6] = 0  # an inner chunk in the middle of a sample chunk's run never written
    data[10:12, :, 9:] = 0  # the last of a run
    return _sharded(root, data, shards=(8, 4, 12), inner=(2, 4, 3), index_location=index_location)


@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_whole_shard_in_a_200_is_cut_right_for_every_inner_chunk_of_a_run(tmp_path, index_location) -> None:
    expected = _coalesced(tmp_path, index_location)
    ranges: list[str] = []
    _check(_pass(tmp_path, "engine", script=_whole_shard(tmp_path, ranges)), expected)
    spans = [tuple(int(x) for x in r.split("=")[1].split("-")) for r in ranges if "=-" not in r]
    assert any(b - a > 200 for a, b in spans)  # runs of several inner chunks (each about 100 bytes) were cut


@pytest.mark.parametrize("index_location", ["start", "end"])
def test_obstore_refuses_a_whole_shard_in_a_200_naming_the_key(tmp_path, index_location) -> None:
    _coalesced(tmp_path, index_location)
    with pytest.raises(InSituError, match="key 'v/c/0/0/0'.*Range request not supported"):
        _pass(tmp_path, "obstore", script=_whole_shard(tmp_path, []))


@pytest.mark.parametrize("client", CLIENTS)
def test_a_whole_shard_in_a_200_to_the_index_suffix_read(tmp_path, client) -> None:
    expected = _coalesced(tmp_path, "end")
    ranges: list[str] = []
    _check(_pass(tmp_path, client, script=_whole_shard(tmp_path, ranges, suffix_only=True)), expected)
    assert all(r.startswith("bytes=-") for r in ranges) and ranges  # every index read was answered whole


@pytest.mark.parametrize("client", CLIENTS)
def test_a_200_not_provably_the_whole_shard_is_refused_naming_the_key(tmp_path, client) -> None:
    _coalesced(tmp_path, "end")
    with pytest.raises(InSituError, match="key 'v/c/0/0/0'.*Range request not supported"):
        _pass(tmp_path, client, script=_whole_shard(tmp_path, [], content_range=False))


NEW_TAG = '"1"'  # the ETag of a shard rewritten on the server
NEW_DATE = "Tue, 02 Jan 2024 00:00:00 GMT"


def _as_version(request: Request, body: bytes, tag: str | None) -> bytes:
    """A store's answer for an object ``body`` at ETag ``tag`` (None: it sends none): 412 to a GET If-Match another."""
    asked = request.headers.get("if-match")
    if asked is not None and asked != tag:
        return answer(412, b"", Last_Modified=NEW_DATE)
    return ranged(body, request.headers.get("range"), Last_Modified=NEW_DATE, **({} if tag is None else {"ETag": tag}))


def _noting(heard: list[Request], then: Script | None = None) -> Script:
    """A script noting every request in ``heard``, then answering as ``then`` (None: as the emulator)."""

    def script(request: Request) -> bytes | None:
        heard.append(request)
        return None if then is None else then(request)

    return script


def _rewritten(new_root: Path, now_new: Callable[[str], bool]) -> Script:
    """A script serving a shard from the served root until ``now_new(path)``, then from ``new_root`` at ``NEW_TAG``."""

    def script(request: Request) -> bytes | None:
        if "/v/c/" not in request.path or not now_new(request.path):
            return None
        return _as_version(request, (new_root / request.path.lstrip("/")).read_bytes(), NEW_TAG)

    return script


def _rewritten_after_first_read(new_root: Path) -> Script:
    """A script serving each shard's first read (its index) from the served root, later ones from ``new_root``."""
    seen: set[str] = set()
    lock = threading.Lock()

    def read_before(path: str) -> bool:
        with lock:
            first = path not in seen
            seen.add(path)
        return not first

    return _rewritten(new_root, read_before)


def _changing_at_every_index_read(root: Path, key: str) -> Script:
    """A script for which shard ``key`` changes (a new ETag, its bytes the same) after each read not If-Match one:
    every inner chunk read through an index read before that is answered 412."""
    version = [0]
    lock = threading.Lock()

    def script(request: Request) -> bytes | None:
        if request.path != f"/{GROUP}/{key}":
            return None
        with lock:
            tag = f'"v{version[0]}"'
            version[0] += "if-match" not in request.headers
        return _as_version(request, (root / request.path.lstrip("/")).read_bytes(), tag)

    return script


def _two_versions(
    tmp_path: Path, compressed: bool, index_location: str, lacking: str = "old"
) -> tuple[Path, Path, np.ndarray]:
    old, new = tmp_path / "old", tmp_path / "new"
    rng = np.random.default_rng(5)
    before, after = (rng.standard_normal((16, 4, 6)).astype("f4") for _ in range(2))
    if not compressed:  # one version lacks its first inner chunk: its offsets are a chunk short of the other's
        (before if lacking == "old" else after)[0:2, :, :3] = 0
    inner = [BytesCodec(), ZstdCodec()] if compressed else [BytesCodec()]
    for root, values in ((old, before), (new, after)):
        arr = zarr.open_group(root / GROUP, mode="a").create_array(
            "v",
            shape=values.shape,
            chunks=(8, 4, 6),
            dtype="f4",
            fill_value=0,
            serializer=ShardingCodec(chunk_shape=(2, 4, 3), codecs=inner, index_location=index_location),
            compressors=None,
            config={"write_empty_chunks": False},
        )
        arr[...] = values
    return old, new, zarr.open_array(new / GROUP / "v", mode="r")[...]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_shard_rewritten_in_the_same_layout_between_index_and_chunks_reads_the_new(
    tmp_path, client, index_location
) -> None:
    # zstd cannot shrink random float32: the new shard's inner chunks lie where the old index says
    old, new, expected = _two_versions(tmp_path, True, index_location)
    _check(_pass(old, client, script=_rewritten_after_first_read(new)), expected)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_shard_rewritten_in_another_layout_between_index_and_chunks_is_read_through_its_new_index(
    tmp_path, client, index_location
) -> None:
    """The inner chunks are read If-Match the index read's ETag: the 412 makes the engine read the new index."""
    old, new, expected = _two_versions(tmp_path, False, index_location, lacking="new")
    heard: list[Request] = []
    _check(_pass(old, client, script=_noting(heard, _rewritten_after_first_read(new))), expected)
    shard = [r for r in heard if "/v/c/" in r.path]
    tags = {r.headers["if-match"] for r in shard if "if-match" in r.headers}
    assert NEW_TAG in tags and len(tags) > 1  # the old version's tag (answered 412), then the new one's
    index = "bytes=0-131" if index_location == "start" else "bytes=-132"  # (8 entries of 16 bytes and a crc32c)
    assert all(r.headers["range"] == index for r in shard if "if-match" not in r.headers)  # the rest conditional


@pytest.mark.parametrize("client", CLIENTS)
def test_a_shard_that_keeps_changing_is_a_bad_chunk_naming_its_key(tmp_path, client) -> None:
    """A second 412 (the shard changed again after its index was read anew): a bad chunk, NaN under "nan"."""
    expected = _small(tmp_path).copy()
    script = _changing_at_every_index_read(tmp_path, DAMAGED_KEY)
    with pytest.raises(BadChunkError, match=f"key '{DAMAGED_KEY}'.*kept changing"):
        _pass(tmp_path, client, script=script)
    expected[8:] = np.nan  # every inner chunk of the shard that kept changing
    _check(_pass(tmp_path, client, script=script, on_bad_chunk="nan"), expected)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_shard_rewritten_between_epochs_is_read_through_its_new_index_in_the_next(tmp_path, client) -> None:
    """The index held from the first epoch is of the old shard: the second epoch's reads meet the 412 and read anew."""
    old, new, expected = _two_versions(tmp_path, False, "end", lacking="new")
    before = zarr.open_array(old / GROUP / "v", mode="r")[...]
    switched = threading.Event()
    heard: list[tuple[bool, Request]] = []

    def note(request: Request) -> None:
        if "/v/c/" in request.path:
            heard.append((switched.is_set(), request))

    script = _rewritten(new, lambda path: switched.is_set())
    # (a pool budget of the working set's floor, as its error names it: no tile is kept from one epoch to the next)
    kept_none = {"cache_budget_bytes": 1152}
    batches = _pass(old, client, script=lambda r: note(r) or script(r), epochs=2, between=switched.set, **kept_none)
    _check(batches[: len(batches) // 2], before)
    _check(batches[len(batches) // 2 :], expected)
    after = [r for switch, r in heard if switch]
    firsts = {r.path: r for r in reversed(after)}  # each shard's first read in the second epoch
    assert len(firsts) == 2 and all(
        "if-match" in r.headers and r.headers["if-match"] != NEW_TAG for r in firsts.values()
    )


def _upload(root: Path, s3: Any, bucket: str) -> None:
    """Put every file of ``root`` in ``bucket`` under its relative path (a whole version of the archive, at once)."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        s3.put_object(Bucket=bucket, Key=path.relative_to(root).as_posix(), Body=path.read_bytes())


@pytest.mark.parametrize("client", CLIENTS)
def test_a_shard_rewritten_in_s3_between_epochs_is_read_through_its_new_index(
    tmp_path, client, s3_server: S3Server, s3_bucket: str
) -> None:
    """moto's S3 answers a GET If-Match an older ETag with 412, as S3 does: the second epoch reads the new shards."""
    old, new, expected = _two_versions(tmp_path, False, "start", lacking="new")
    before = zarr.open_array(old / GROUP / "v", mode="r")[...]
    s3 = s3_server.boto3_client()
    _upload(old, s3, s3_bucket)
    options = s3_server.client_options()
    store = obstore_store(f"s3://{s3_bucket}/{GROUP}", read_only=True, client=client, retry=FEW_RETRIES, **options)
    try:
        batches = _read(store, epochs=2, between=lambda: _upload(new, s3, s3_bucket), cache_budget_bytes=1152)
    finally:
        close_store(store)
    _check(batches[: len(batches) // 2], before)
    _check(batches[len(batches) // 2 :], expected)


def test_a_local_shard_rewritten_between_epochs_is_read_through_its_new_index(tmp_path) -> None:
    """A local directory's shard rewritten in place: the file's version (inode, size, mtime) is its ETag."""
    old, new, expected = _two_versions(tmp_path, False, "end", lacking="new")
    before = zarr.open_array(old / GROUP / "v", mode="r")[...]
    store = obstore_store(old / GROUP, read_only=True)

    def rewrite() -> None:
        shutil.copytree(new / GROUP / "v" / "c", old / GROUP / "v" / "c", dirs_exist_ok=True)

    try:
        batches = _read(store, epochs=2, between=rewrite, cache_budget_bytes=1152)
    finally:
        close_store(store)
    _check(batches[: len(batches) // 2], before)
    _check(batches[len(batches) // 2 :], expected)


def test_a_local_shard_that_keeps_changing_is_a_bad_chunk_naming_its_key(tmp_path, monkeypatch) -> None:
    """Another writer touches the file after each read of its index: its inner chunks are bad chunks, NaN under "nan"."""
    expected = _small(tmp_path).copy()
    shard = tmp_path / GROUP / DAMAGED_KEY
    versioned = LocalFiles.versioned

    def touched_after_index_reads(self, key, *, prototype, byte_range, version=""):
        got = versioned(self, key, prototype=prototype, byte_range=byte_range, version=version)
        if key == DAMAGED_KEY and not version:
            os.utime(shard, ns=(time.time_ns(), shard.stat().st_mtime_ns + 1))
        return got

    monkeypatch.setattr(LocalFiles, "versioned", touched_after_index_reads)
    store = obstore_store(tmp_path / GROUP, read_only=True)
    try:
        with pytest.raises(BadChunkError, match=f"key '{DAMAGED_KEY}'.*kept changing"):
            _read(store)
        expected[8:] = np.nan  # every inner chunk of the shard that kept changing
        _check(_read(store, on_bad_chunk="nan"), expected)
    finally:
        close_store(store)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("tag", [None, 'W/"1"'], ids=["no-etag", "weak-etag"])
def test_a_server_that_sends_no_strong_etag_is_read_without_if_match(tmp_path, client, tag) -> None:
    """No ETag, or a weak one (which If-Match never matches): inner chunks are read as before, unconditionally."""
    expected = _small(tmp_path)
    heard: list[Request] = []

    def untagged(request: Request) -> bytes | None:
        if "/v/c/" not in request.path:
            return None
        return _as_version(request, (tmp_path / request.path.lstrip("/")).read_bytes(), tag)

    _check(_pass(tmp_path, client, script=_noting(heard, untagged)), expected)
    assert any("/v/c/" in r.path for r in heard) and not any("if-match" in r.headers for r in heard)


def _refusing_long_suffixes(root: Path) -> Script:
    """A script answering a suffix longer than the object with 416 (as some servers do), else as the file."""

    def script(request: Request) -> bytes | None:
        asked = request.headers.get("range", "")
        if "/v/c/" not in request.path or "=-" not in asked:
            return None
        body = (root / request.path.lstrip("/")).read_bytes()
        if int(asked.split("=-")[1]) > len(body):
            return answer(416, b"", Content_Range=f"bytes */{len(body)}", **DATED)
        return ranged(body, asked, **DATED)

    return script


@pytest.mark.parametrize("client", CLIENTS)
def test_a_416_to_the_index_suffix_of_a_tiny_shard_is_an_error_not_the_fill_value(tmp_path, client) -> None:
    _small(tmp_path)
    shard = tmp_path / GROUP / DAMAGED_KEY
    shard.write_bytes(shard.read_bytes()[-20:])  # shorter than its 132-byte index
    with pytest.raises(Exception):  # noqa: B017, PT011 - zarr raises whatever its codecs raise
        zarr.open_array(tmp_path / GROUP / "v", mode="r")[...]
    with pytest.raises(BadChunkError, match=f"key '{DAMAGED_KEY}'.*416"):
        _pass(tmp_path, client, script=_refusing_long_suffixes(tmp_path))
    expected = _small(tmp_path / "intact").copy()
    expected[8:] = np.nan  # a damaged shard, as one whose index is cut short: every inner chunk of it a bad chunk
    _check(_pass(tmp_path, client, script=_refusing_long_suffixes(tmp_path), on_bad_chunk="nan"), expected)


# (obstore refuses a 200 to a ranged GET: test_obstore_refuses_a_whole_shard_in_a_200_naming_the_key)
@pytest.mark.parametrize(("client", "whole"), [("engine", False), ("obstore", False), ("engine", True)])
def test_long_coalesced_runs_with_holes_in_a_shuffled_pass(tmp_path, client, whole) -> None:
    """Sample chunks of 32 inner chunks in a row (past a run's cap of tiles), some never written, shuffled."""
    data = _holey((12, 4, 16), "f4", seed=9)
    data[2:4, 1, 4:6] = 0
    data[8:10, :, 10:] = 0
    expected = _sharded(tmp_path, data, shards=(4, 4, 16), inner=(2, 1, 2))
    ranges: list[str] = []
    script = _whole_shard(tmp_path, ranges) if whole else None
    batches = _pass(tmp_path, client, script=script, shuffle=True, seed=3, batch_size=5)
    _check(batches, expected)
    assert not whole or ranges


@pytest.mark.parametrize("client", CLIENTS)
def test_nested_shards(tmp_path, client) -> None:
    import warnings

    from zarr.errors import ZarrUserWarning

    data = _holey((12, 4, 6), "f4", seed=10)
    data[4:6, :2] = 0
    inner = ShardingCodec(chunk_shape=(1, 2, 3), codecs=[BytesCodec(), ZstdCodec()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZarrUserWarning)  # zarr warns about the nested partial reads it cannot do
        arr = zarr.open_group(tmp_path / GROUP, mode="a").create_array(
            "v",
            shape=data.shape,
            chunks=(6, 4, 6),
            dtype="f4",
            fill_value=0,
            serializer=ShardingCodec(chunk_shape=(2, 4, 3), codecs=[inner]),
            compressors=None,
        )
        arr[...] = data
        expected = zarr.open_array(tmp_path / GROUP / "v", mode="r")[...]
    _check(_pass(tmp_path, client), expected)


# --- 4. unsharded arrays: missing chunks, fill values, v2 nesting, names to encode ------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fill_value", [float("nan"), -7.5], ids=["nan", "non-zero"])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_chunks_never_written_read_as_the_fill_value(tmp_path, client, fill_value, zarr_format) -> None:
    data = _holey((14, 6, 5), "f4", seed=6)
    data[3:6] = fill_value  # whole sample chunks never written
    data[9:12, 3:] = fill_value  # one tile of a sample chunk never written
    group = zarr.open_group(tmp_path / GROUP, mode="a", zarr_format=zarr_format)
    arr = group.create_array(
        "v",
        shape=data.shape,
        chunks=(3, 3, 5),
        dtype="f4",
        fill_value=fill_value,
        config={"write_empty_chunks": False},
    )
    arr[...] = data
    chunk_files = [p for p in (tmp_path / GROUP / "v").rglob("*") if p.is_file() and p.name[0].isdigit()]
    assert len(chunk_files) == 7  # of 10: the three never written are absent
    expected = zarr.open_array(tmp_path / GROUP / "v", mode="r")[...]
    heard: list[Request] = []
    _check(_pass(tmp_path, client, script=_noting(heard)), expected)
    assert heard and not any("if-match" in r.headers for r in heard)  # (an unsharded read is never conditional)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_v2_array_with_slash_separated_chunk_keys(tmp_path, client) -> None:
    data = _holey((11, 4, 6), "<i4", seed=7)
    data[6:9] = 3  # never written (the fill value)
    arr = zarr.create_array(
        tmp_path / GROUP / "v",
        shape=data.shape,
        chunks=(3, 2, 6),
        dtype="<i4",
        fill_value=3,
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
        config={"write_empty_chunks": False},
    )
    arr[...] = data
    zarr.open_group(tmp_path / GROUP, mode="a", zarr_format=2)  # (the group's .zgroup)
    assert (tmp_path / GROUP / "v" / "0" / "0" / "0").is_file()
    expected = zarr.open_array(tmp_path / GROUP / "v", mode="r")[...]
    _check(_pass(tmp_path, client), expected)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("sharded", [False, True], ids=["chunked", "sharded"])
@pytest.mark.parametrize("name", ["a b", "100%", "caf\u00e9", "x+y=z", "semi;colon", "tilde~'quote'"])
def test_array_names_that_need_percent_encoding(tmp_path, client, sharded, name) -> None:
    data = _holey((9, 4, 6), "f4", seed=8)
    data[3:6, :, :3] = 0
    if sharded:
        expected = _sharded(tmp_path, data, shards=(3, 4, 6), inner=(3, 2, 3), name=name)
    else:
        arr = zarr.open_group(tmp_path / GROUP, mode="a").create_array(
            name, shape=data.shape, chunks=(3, 2, 3), dtype="f4", fill_value=0, config={"write_empty_chunks": False}
        )
        arr[...] = data
        expected = zarr.open_array(tmp_path / GROUP / name, mode="r")[...]
    _check(_pass(tmp_path, client, name=name), expected)
