"""Icechunk repositories through the engine: one version per store, zarr's values, each chunk read once.

Each pass is compared with zarr-python's read of the same snapshot. Reads are
counted per key and byte range under the engine (``RangeCounter``). The disk
cache keeps each snapshot's chunks apart: a new snapshot fetches everything,
the old one still revives. Over S3 the repository lives in moto's server on
loopback, through icechunk's own S3 storage (custom endpoint, plain HTTP).
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from helpers import CountingStore
from servers import S3_KEY_ID, S3_REGION, S3_SECRET

from insitubatch import InSituDataset, close_store, icechunk_store, open_geometries, split_by_chunk
from insitubatch.cache.fingerprint import source_identity
from insitubatch.stores.icechunk_stores import InSituIcechunkStore

icechunk = pytest.importorskip("icechunk")

SHAPE = (40, 6, 10)
CHUNKS = (4, 3, 10)  # 10 x 2 stored chunks
SHARDS = (8, 6, 10)  # 5 shards of 2 x 2 inner chunks
DIMS = ("time", "y", "x")


class RangeCounter(CountingStore):
    """Counts GETs per ``(key, byte range)`` too: reading a stored chunk (or a shard's part) twice shows."""

    def __init__(self, store: Any, **kwargs: Any) -> None:
        super().__init__(store, **kwargs)
        self.ranges: Counter[tuple[str, str]] = Counter()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.ranges[(key, repr(byte_range))] += 1
        return await super().get(key, prototype, byte_range)

    def chunk_ranges(self) -> dict[tuple[str, str], int]:
        """Reads of chunk keys (metadata documents left out) by key and byte range."""
        chunks = self.chunk_gets()
        return {k: n for k, n in self.ranges.items() if k[0] in chunks}


def _field(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(SHAPE, dtype="f4")


def _repo(where: Any) -> Any:
    storage = where if isinstance(where, icechunk.Storage) else icechunk.local_filesystem_storage(str(where))
    return icechunk.Repository.create(storage)


def _commit(repo: Any, values: dict[str, np.ndarray], *, shards: bool = False, create: bool = True) -> str:
    """Write ``values`` (creating the arrays on the first commit) and commit; returns the snapshot id."""
    session = repo.writable_session("main")
    root = zarr.open_group(session.store, mode="a")
    for name, data in values.items():
        if create:
            extra = {"shards": SHARDS} if shards else {}
            root.create_array(name, shape=data.shape, chunks=CHUNKS, dtype=data.dtype, dimension_names=DIMS, **extra)
        root[name][...] = data
    return session.commit(f"write {sorted(values)}")


def _zarr_read(repo: Any, snapshot: str, name: str) -> np.ndarray:
    return zarr.open_array(repo.readonly_session(snapshot_id=snapshot).store, path=name, mode="r")[...]


def _epoch(store: Any, variables: Any, **knobs: Any) -> tuple[dict[str, np.ndarray], Any, int]:
    """Every label's rows of one sequential pass over the whole store, its counters, and the GETs ``describe()`` stated."""
    geoms = open_geometries(store, variables=["t"])
    chosen = variables(geoms)
    manifest = split_by_chunk(geoms["t"], fractions=(1.0,))
    with InSituDataset(store, manifest, chosen, batch_size=7, shuffle=False, hedge=False, **knobs) as ds:
        info = ds.describe()  # the pass's GETs (a sharded array's indexes included) and those read as it opened
        predicted = info["splits"]["train"]["gets"] + info["open"]["gets"]
        batches = list(ds.split("train"))
        counters = ds.split("train").last_pass
    return {label: np.concatenate([b.arrays[label] for b in batches]) for label in chosen}, counters, predicted


VARIABLES = {
    "whole": (lambda g: {"t": g["t"]}, lambda a: {"t": a}),
    "selection": (
        lambda g: {"north": g["t"].isel(y=slice(0, 3)), "east": g["t"].isel(x=slice(5, 10))},
        lambda a: {"north": a[:, 0:3], "east": a[:, :, 5:10]},
    ),
}


@pytest.mark.parametrize("shards", [False, True], ids=["chunks", "shards"])
@pytest.mark.parametrize("variables", list(VARIABLES))
def test_a_pass_equals_zarr_on_the_snapshot_and_reads_each_chunk_once(tmp_path: Path, shards: bool, variables) -> None:
    repo = _repo(tmp_path / "repo")
    snapshot = _commit(repo, {"t": _field(0)}, shards=shards)
    store = RangeCounter(icechunk_store(repo, snapshot=snapshot))
    rows, counters, predicted = _epoch(store, VARIABLES[variables][0])
    expected = VARIABLES[variables][1](_zarr_read(repo, snapshot, "t"))
    for label, want in expected.items():
        np.testing.assert_array_equal(rows[label], want)
    chunk_reads = store.chunk_ranges()
    assert chunk_reads and set(chunk_reads.values()) == {1}  # no key, no byte range of one, read twice
    if not shards:  # every stored chunk, once (two selections that share a chunk share its read)
        assert len(chunk_reads) == 10 * 2 == counters.gets
    if variables == "whole":  # the GETs describe() states (a sharded array's indexes included), and no more
        assert sum(store.chunk_gets().values()) == predicted


def test_branch_tag_and_snapshot_each_open_their_version(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    a, b = _field(1), _field(2)
    snap_a = _commit(repo, {"t": a})
    repo.create_tag("v1", snap_a)
    snap_b = _commit(repo, {"t": b}, create=False)
    repo.create_branch("frozen", snap_a)
    for kwargs, snap, want in [
        ({}, snap_b, b),  # none: branch "main", as before
        ({"branch": "main"}, snap_b, b),
        ({"branch": "frozen"}, snap_a, a),
        ({"tag": "v1"}, snap_a, a),
        ({"snapshot": snap_a}, snap_a, a),
    ]:
        for where in (repo, repo.storage, tmp_path / "repo", (tmp_path / "repo").as_uri()):
            store = icechunk_store(where, **kwargs)
            assert store.session.snapshot_id == snap
            np.testing.assert_array_equal(zarr.open_array(store, path="t", mode="r")[...], want)
            close_store(store)


def test_the_store_is_ours_and_delegates_every_call_to_the_sessions_store(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    snap = _commit(repo, {"t": _field(3)})
    store = icechunk_store(repo, snapshot=snap)
    assert isinstance(store, InSituIcechunkStore) and not isinstance(store, icechunk.IcechunkStore)
    assert f"snapshot {snap!r}" in str(store) and str(tmp_path / "repo") in str(store)
    assert store.supports_consolidated_metadata is False  # icechunk's answer, not zarr's default
    for copy in (pickle.loads(pickle.dumps(store)), store.with_read_only(True)):
        assert isinstance(copy, InSituIcechunkStore) and str(copy) == str(store)
        assert copy.session.snapshot_id == snap
        np.testing.assert_array_equal(zarr.open_array(copy, path="t", mode="r")[...], _field(3))
    # a writable one: zarr writes through it, icechunk's own methods and its session are the session store's
    with icechunk_store(repo, read_only=False) as writer:
        assert callable(writer.set_virtual_ref)
        zarr.open_array(writer, path="t", mode="r+")[0] = -1
        snap_b = writer.session.commit("a row")
    assert icechunk_store(repo).session.snapshot_id == snap_b
    np.testing.assert_array_equal(zarr.open_array(icechunk_store(repo), path="t", mode="r")[0], -1)


def test_version_errors_name_what_is_valid(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    snap = _commit(repo, {"t": _field(1)})
    repo.create_tag("v1", snap)
    with pytest.raises(ValueError, match=r"branch='main', tag='v1'.*at most one"):
        icechunk_store(repo, branch="main", tag="v1")
    with pytest.raises(ValueError, match=r"tag='v1', snapshot=.*at most one"):
        icechunk_store(repo, tag="v1", snapshot=snap)
    with pytest.raises(ValueError, match=r"branch='dev' is not a branch .* it has \['main'\]"):
        icechunk_store(repo, branch="dev")
    with pytest.raises(ValueError, match=r"tag='v2' is not a tag .* it has \['v1'\]"):
        icechunk_store(repo, tag="v2")
    with pytest.raises(ValueError, match="is not an icechunk snapshot id"):
        icechunk_store(repo, snapshot="not-a-snapshot")
    with pytest.raises(ValueError, match="is not a snapshot of the icechunk repository"):
        icechunk_store(repo, snapshot="0" * 20)
    with pytest.raises(ValueError, match="only a branch takes commits"):
        icechunk_store(repo, tag="v1", read_only=False)
    with pytest.raises(ValueError, match="tag=''"):
        icechunk_store(repo, tag="")


def _persisted_pass(repo: Any, snapshot: str, cache_dir: Path) -> tuple[np.ndarray, Any]:
    store = CountingStore(icechunk_store(repo, snapshot=snapshot))
    rows, counters, _ = _epoch(store, VARIABLES["whole"][0], cache_dir=cache_dir, persist=True)
    assert counters.gets == sum(store.chunk_gets().values())
    return rows["t"], counters


def test_a_new_snapshot_never_revives_another_snapshots_chunks(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    cache_dir = tmp_path / "cache"
    a, b = _field(3), _field(4)
    snap_a = _commit(repo, {"t": a})
    rows, counters = _persisted_pass(repo, snap_a, cache_dir)  # persist snapshot A's chunks
    np.testing.assert_array_equal(rows, a)
    assert counters.gets == 20 and counters.revived == 0

    snap_b = _commit(repo, {"t": b}, create=False)  # every chunk of B differs from A's
    rows, counters = _persisted_pass(repo, snap_b, cache_dir)
    np.testing.assert_array_equal(rows, b)
    assert counters.gets == 20 and counters.revived == 0  # fetched again: nothing of A's was revived

    rows, counters = _persisted_pass(repo, snap_a, cache_dir)
    np.testing.assert_array_equal(rows, a)
    assert counters.gets == 0 and counters.revived == 10  # A's cache is still there: its 10 time chunks
    rows, counters = _persisted_pass(repo, snap_b, cache_dir)
    np.testing.assert_array_equal(rows, b)
    assert counters.gets == 0 and counters.revived == 10
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted([f"icechunk-{snap_a}", f"icechunk-{snap_b}"])


def test_a_branch_store_caches_under_the_snapshot_it_opened(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    snap = _commit(repo, {"t": _field(5)})
    store = icechunk_store(repo)  # the tip of main, pinned when the session opened
    assert source_identity(store) == f"icechunk-{snap}"
    assert source_identity(CountingStore(store)) == f"icechunk-{snap}"  # through a wrapper too
    assert source_identity(zarr.storage.MemoryStore()) is None  # a plain store names no version


def test_persist_refuses_a_session_with_uncommitted_changes(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    _commit(repo, {"t": _field(6)})
    writer = icechunk_store(repo, read_only=False)
    zarr.open_array(writer, path="t", mode="r+")[0] = 0.5  # uncommitted
    manifest = split_by_chunk(open_geometries(writer)["t"], fractions=(1.0,))
    with pytest.raises(ValueError, match="uncommitted changes.*commit first"):
        InSituDataset(writer, manifest, batch_size=7, cache_dir=tmp_path / "cache", persist=True)
    with InSituDataset(writer, manifest, batch_size=7, shuffle=False, cache_dir=tmp_path / "spill") as ds:
        rows = np.concatenate([b.arrays["t"] for b in ds.split("train")])
    assert rows[0, 0, 0] == np.float32(0.5)  # what the session reads, its own change included


def test_a_pass_feeds_torch_from_a_snapshot(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from insitubatch import as_torch

    repo = _repo(tmp_path / "repo")
    snap = _commit(repo, {"t": _field(7)})
    store = icechunk_store(repo, snapshot=snap)
    manifest = split_by_chunk(open_geometries(store)["t"], fractions=(1.0,))
    with InSituDataset(store, manifest, batch_size=7, shuffle=False) as ds:
        tensors = [item["t"] for item in as_torch(ds.train)]
    assert all(isinstance(t, torch.Tensor) for t in tensors)
    np.testing.assert_array_equal(torch.cat(tensors).numpy(), _zarr_read(repo, snap, "t"))


def test_a_repository_on_s3_reads_like_zarr(s3_server: Any, s3_bucket: str) -> None:
    storage = icechunk.s3_storage(
        bucket=s3_bucket,
        prefix="repos/era",
        endpoint_url=s3_server.endpoint,
        allow_http=True,
        force_path_style=True,
        access_key_id=S3_KEY_ID,
        secret_access_key=S3_SECRET,
        region=S3_REGION,
    )
    repo = _repo(storage)
    a = _field(8)
    snap = _commit(repo, {"t": a}, shards=True)
    _commit(repo, {"t": a + 1}, create=False)  # the tip moves on; the pass reads the snapshot asked for
    store = RangeCounter(icechunk_store(storage, snapshot=snap))
    rows, counters, predicted = _epoch(store, VARIABLES["whole"][0])
    np.testing.assert_array_equal(rows["t"], _zarr_read(repo, snap, "t"))
    np.testing.assert_array_equal(rows["t"], a)
    assert set(store.chunk_ranges().values()) == {1}
    assert sum(store.chunk_gets().values()) == predicted
