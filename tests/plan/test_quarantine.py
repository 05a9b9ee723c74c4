"""Quarantined chunks: left out of every split, never read (not through a window either), saved in the manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, smooth_field, write_array

from insitubatch import InSituDataset, SplitManifest, open_geometries, split_by_chunk, split_by_time
from insitubatch._engine.reads.reader import BadChunkRecord
from insitubatch.io.geometry import ArrayGeometry

N = 60
ANCHOR = 6  # x: 10 chunks of 6 (the anchor grid)
COARSE = 15  # z: 4 chunks of 15
FINE = 4  # w: 15 chunks of 4
SHIFT = 2


def _geom(path: str, size: int, n: int = N) -> ArrayGeometry:
    return ArrayGeometry(
        path=path, shape=(n, 3), chunks=(size, 3), stored_chunks=(size, 3), dtype=np.dtype("f4"), fill_value=0.0
    )


@pytest.fixture
def store_path(tmp_path):
    rng = np.random.default_rng(7)
    root = zarr.open_group(tmp_path / "q.zarr", mode="w")
    data = {}
    for name, size in (("x", ANCHOR), ("z", COARSE), ("w", FINE)):
        data[name] = smooth_field(rng, (N, 3, 4))
        write_array(root, name, data[name], (size, 3, 4))
    return tmp_path / "q.zarr", data


def _keys_of(g: ArrayGeometry, chunks) -> set[str]:
    return {g.chunk_key(g.physical_chunk_coord(c)) for c in chunks}


# -- the manifest -------------------------------------------------------------------------------
def test_quarantined_chunks_are_in_no_split_and_fractions_count_the_rest() -> None:
    g = _geom("x", ANCHOR)
    m = split_by_chunk(g, fractions=(0.5, 0.25, 0.25), exclude_chunks=[3, np.int64(7)])
    assert m.excluded_chunks == (3, 7)
    held = [c for name in m.names for c in m.chunks(name)]
    assert sorted(held) == [0, 1, 2, 4, 5, 6, 8, 9]  # the 8 that remain, each in one split
    assert [len(m.chunks(n)) for n in m.names] == [4, 2, 2]  # fractions of the 8, not of the 10
    for seed in (0, 1, 2):
        shuffled = split_by_chunk(g, contiguous=False, seed=seed, exclude_chunks=[3, 7])
        assert not {3, 7} & {c for n in shuffled.names for c in shuffled.chunks(n)}


def test_json_round_trip_keeps_the_quarantine_and_old_formats_load() -> None:
    g = _geom("x", ANCHOR)
    m = split_by_chunk(g, exclude_chunks=[3, 7])
    doc = json.loads(m.to_json())
    assert doc["format"] == 3 and doc["excluded_chunks"] == [3, 7]
    assert SplitManifest.from_json(m.to_json()) == m
    plain = split_by_chunk(g)
    assert json.loads(plain.to_json())["format"] == 1 and "excluded_chunks" not in plain.to_json()
    # a manifest without exclusions keeps the fingerprint it had before they existed (format 1, the same keys)
    before = {k: v for k, v in doc.items() if k != "excluded_chunks"}
    before.update(format=1, splits={"train": list(range(8)), "val": [8], "test": [9]})
    assert plain.to_json() == json.dumps(before)
    assert plain.fingerprint() == SplitManifest.from_json(json.dumps(before)).fingerprint()
    assert m.fingerprint() != plain.fingerprint()
    # format 2 (a date split) still loads, without a quarantine
    two = dict(before, format=2, sample_ranges={}, dim="time", edges="chunk", dates={})
    assert SplitManifest.from_json(json.dumps(two)).excluded_chunks == ()
    with pytest.raises(ValueError, match="format 5 is not a supported one"):  # one from a later library
        SplitManifest.from_json(json.dumps(dict(before, format=5)))
    with pytest.raises(
        ValueError, match=r"excluded_chunks \[12\] lie outside the anchor grid: 60 samples .* 10 chunks"
    ):
        SplitManifest.from_json(json.dumps(dict(doc, excluded_chunks=[3, 12])))  # edited by hand


def test_records_map_onto_the_anchor_grid() -> None:
    x, z, w = _geom("x", ANCHOR), _geom("z", COARSE), _geom("w", FINE)
    others = {"z": z, "w": w}
    # the manifest's own array: its chunk index is the anchor chunk
    assert split_by_chunk(x, exclude_chunks=[BadChunkRecord("x", 5, (0,))]).excluded_chunks == (5,)
    # a coarser array: z's chunk 1 holds samples 15..29, in anchor chunks 2, 3 and 4
    m = split_by_chunk(x, exclude_chunks=[BadChunkRecord("z", 1, (0,))], geometries=others)
    assert m.excluded_chunks == (2, 3, 4)
    # a finer one: w's chunk 4 holds samples 16..19, across anchor chunks 2 and 3; chunk 3 (12..15) only 2
    m = split_by_chunk(x, exclude_chunks=[BadChunkRecord("w", 4, (0,)), BadChunkRecord("w", 3, (0,))], geometries=[w])
    assert m.excluded_chunks == (2, 3)
    # records and indices mix; duplicates collapse; geometries may be keyed by label (their paths count)
    m = split_by_chunk(x, exclude_chunks=[9, BadChunkRecord("w", 0, (0,)), 9], geometries={"label": w})
    assert m.excluded_chunks == (0, 9)


@pytest.mark.parametrize(
    ("exclude", "geometries", "exc", "match"),
    [
        ([10], None, ValueError, r"chunk 10 is outside the array: 'x' has 10 chunks of 6 samples .*\(0 \.\. 9\)"),
        ([-1], None, ValueError, "chunk -1 is outside the array"),
        ([BadChunkRecord("z", 4, (0,))], {"z": _geom("z", COARSE)}, ValueError, "record of 'z' 4 is outside"),
        ([BadChunkRecord("z", 0, (0,))], None, ValueError, r"names array 'z'.*geometries=open_geometries\(store\)"),
        ([BadChunkRecord("z", 0, (0,))], {"z": _geom("z", COARSE, n=30)}, ValueError, "30 samples"),
        ([True], None, TypeError, "each item must be an anchor-grid chunk index or a bad-chunk record"),
        (["3"], None, TypeError, "each item must be"),
        ("3", None, TypeError, "exclude_chunks must be an iterable"),
        (3, None, TypeError, "exclude_chunks must be an iterable"),
        (BadChunkRecord("x", 0, (0,)), None, TypeError, "exclude_chunks must be an iterable"),
        ([0], [object()], TypeError, "geometries must hold ArrayGeometry"),
    ],
)
def test_bad_exclusions_are_clear_errors(exclude, geometries, exc, match) -> None:
    with pytest.raises(exc, match=match):
        split_by_chunk(_geom("x", ANCHOR), exclude_chunks=exclude, geometries=geometries)


def test_too_few_chunks_left_says_how_many_are_quarantined() -> None:
    g = _geom("x", ANCHOR, n=18)  # 3 chunks
    with pytest.raises(ValueError, match=r"holds 1 chunk\(s\) besides 2 quarantined"):
        split_by_chunk(g, fractions=(0.5, 0.5), exclude_chunks=[0, 2])


def test_describe_names_the_quarantined_chunks_and_samples() -> None:
    m = split_by_chunk(_geom("x", ANCHOR), exclude_chunks=[3, 4, 9])
    last = m.describe().splitlines()[-1]
    assert last == "  quarantined: chunks 3, 4, 9 (samples 18 .. 29, 54 .. 59): in no split, never read"
    assert "quarantined" not in split_by_chunk(_geom("x", ANCHOR)).describe()


# -- passes -------------------------------------------------------------------------------------
def _anchors(view) -> list[int]:
    return [int(a) for b in view for a in b.sample_indices]


def test_no_pass_reads_a_quarantined_chunk_nor_an_anchor_whose_window_reaches_one(store_path) -> None:
    path, data = store_path
    store = CountingStore(local_store(path))
    geoms = open_geometries(store)
    x = geoms["x"]
    manifest = split_by_chunk(x, fractions=(0.6, 0.2, 0.2), exclude_chunks=[4])
    variables = {"x": x, "y": x.shift(SHIFT), "z": geoms["z"]}
    with InSituDataset(store, manifest, variables, batch_size=5, block_chunks=2) as ds:
        seen = {name: _anchors(getattr(ds, name)) for name in ("train", "val", "test")}
        seen["all"] = _anchors(ds.all)
        for batch in ds.train:  # the values are zarr's
            np.testing.assert_array_equal(batch.arrays["y"], data["x"][batch.sample_indices + SHIFT])
            np.testing.assert_array_equal(batch.arrays["z"], data["z"][batch.sample_indices])
        notes = ds.describe()["notes"]
    # anchor chunk 4 holds 24..29; y reads anchor + 2, so anchors 22 and 23 would reach it through y
    expected = [a for a in range(N - SHIFT) if not 22 <= a < 30]
    assert sorted(seen["train"] + seen["val"] + seen["test"]) == expected
    assert sorted(seen["all"]) == expected
    assert not _keys_of(x, [4]) & set(store.gets), sorted(store.gets)
    assert _keys_of(x, [3, 5]) <= set(store.gets)  # its neighbours are read (z, chunked otherwise, reads 15..29)
    assert any(n.startswith("quarantined: chunk 4 of the anchor grid (samples 24 .. 29)") for n in notes), notes


def test_bad_chunks_of_another_array_quarantine_its_samples(store_path) -> None:
    path, data = store_path
    geoms = open_geometries(str(path))
    z = geoms["z"]
    key = z.chunk_key(z.physical_chunk_coord(1))
    with open(path / key, "r+b") as f:  # z's chunk 1 (samples 15..29) no longer decodes
        f.write(b"\xff" * 16)
    manifest = split_by_chunk(geoms["x"], fractions=(1.0,))
    with InSituDataset(str(path), manifest, geoms, batch_size=8, on_bad_chunk="nan") as ds:
        list(ds.train)
        bad = list(ds.bad_chunks)
    assert [(r.array, r.chunk_index) for r in bad] == [("z", 1)]
    quarantined = split_by_chunk(geoms["x"], fractions=(0.8, 0.2), exclude_chunks=bad, geometries=geoms)
    assert quarantined.excluded_chunks == (2, 3, 4)  # samples 12..29 on the anchor grid
    store = CountingStore(local_store(path))
    with InSituDataset(store, quarantined, open_geometries(store), batch_size=8) as ds:
        anchors = sorted(_anchors(ds.train) + _anchors(ds.val))
        for batch in ds.train:
            assert not np.isnan(batch.arrays["z"]).any()
    assert anchors == [a for a in range(N) if not 12 <= a < 30]
    assert key not in store.gets and store.gets  # the bad chunk is never fetched; the others are


def test_a_split_emptied_through_its_windows_says_so(store_path) -> None:
    path, _ = store_path
    x = open_geometries(str(path))["x"]
    # val is chunk 9 (samples 54..59); y = x.shift(-6) reads each val anchor in chunk 8, which is quarantined
    manifest = SplitManifest(
        array="x",
        n_samples=N,
        sample_chunk_size=ANCHOR,
        splits=(("train", tuple(range(8))), ("val", (9,))),
        sample_range=(0, N),
        fractions=(0.8, 0.2),
        contiguous=True,
        seed=0,
        excluded_chunks=(8,),
    )
    with InSituDataset(str(path), manifest, {"x": x, "y": x.shift(-ANCHOR)}, batch_size=4) as ds:
        assert list(ds.val) == [] and len(_anchors(ds.train)) == 42  # train: 6..47 (y reads 0..41)
        notes = ds.describe()["notes"]
    assert any("each of its anchors reads a quarantined chunk ([8])" in n for n in notes), notes


# -- date splits -------------------------------------------------------------------------------
def test_date_splits_leave_quarantined_chunks_out_and_count_what_remains(tmp_path) -> None:
    from insitubatch.testing.data import six_hourly, write_dated

    path = write_dated(tmp_path / "era5.zarr", six_hourly("2016-01-01", 40), chunk=4)  # a day per chunk
    g = open_geometries(local_store(path))["t2m"]
    ranges = {"train": ("2016-01-01", "2016-01-06"), "val": ("2016-01-07", None)}
    for edges in ("chunk", "exact"):
        m = split_by_time(g, ranges, edges=edges, exclude_chunks=[0, 5])
        assert m.excluded_chunks == (0, 5)
        for name in m.names:
            samples = m.sample_indices(name)
            assert not {0, 5} & set(m.chunks(name)) and not np.isin(samples // 4, [0, 5]).any()
            assert m.split_dates(name).samples == len(samples)
        train = m.split_dates("train")  # Jan 1 and Jan 6 are out: Jan 2 .. Jan 5 remain
        assert (train.first, train.last, train.samples) == ("2016-01-02", "2016-01-05T18:00", 16), train
        assert m.split_dates("val").samples == 16
        assert SplitManifest.from_json(m.to_json()) == m
    with pytest.raises(ValueError, match="split 'val' .* holds no sample once the quarantined chunks"):
        split_by_time(g, {"train": ("2016-01-01", "2016-01-02"), "val": ("2016-01-10", None)}, exclude_chunks=[9])
