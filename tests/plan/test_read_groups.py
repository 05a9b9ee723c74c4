"""Model-parallel read groups: members read the same samples, each its band; a replica reads each tile once."""

from __future__ import annotations

import json
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, local_store, run_gloo_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

from insitubatch import InSituDataset, obstore_store, open_geometries, open_statics, split_by_chunk
from insitubatch.plan.read_groups import band_cuts

N, LEVELS, LAT, LON = 83, 2, 20, 6  # a ragged sample axis; 4 latitude tiles of 5 rows
CHUNKS = (4, 1, 5, 6)


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("groups") / "g.zarr")


def _write(where: Path) -> Path:
    """An ERA5-shaped store written by zarr-python: a 4-D field, a land-sea mask, a 1-D series, latitudes."""
    root = zarr.open_group(where, mode="w")
    x = np.random.default_rng(0).random((N, LEVELS, LAT, LON), dtype="f4")
    dims = ("time", "level", "latitude", "longitude")
    root.create_array("x", shape=x.shape, chunks=CHUNKS, dtype="f4", dimension_names=dims)[:] = x
    root.create_array("lsm", shape=(LAT, LON), chunks=(LAT, LON), dtype="f4", dimension_names=dims[2:])[:] = x[0, 0]
    root.create_array("series", shape=(N,), chunks=(4,), dtype="f4", dimension_names=("time",))[:] = x[:, 0, 0, 0]
    lat = root.create_array("latitude", shape=(LAT,), dtype="f8", dimension_names=("latitude",))
    lat[:] = np.linspace(90, -90, LAT)
    return where


def _ds(store, rank, world, group=2, part="latitude", **kw):
    g = open_geometries(store, variables=["x", "series"])  # named: an HTTP store cannot list
    x = g["x"]
    kw = {"batch_size": 5, "block_chunks": 3, "seed": 3, **kw}
    variables = {"x": x, "y": x.shift(2), "s": g["series"]}
    return InSituDataset(
        store,
        split_by_chunk(x, fractions=(0.8, 0.2)),
        variables,
        statics=["lsm"],
        rank=rank,
        world_size=world,
        read_group_size=group,
        read_group_part=part,
        **kw,
    )


def _run(path, world, group, split="train", **kw):
    """Every rank's batches (copied) and chunk GETs, ranks simulated in-process."""
    out = []
    for rank in range(world):
        store = CountingStore(local_store(path))
        with _ds(store, rank, world, group, **kw) as ds:
            store.reset()
            batches = [
                (b.sample_indices.copy(), {k: np.array(v) for k, v in b.arrays.items()}, b.extras.get("padded"))
                for b in ds.split(split)
            ]
            out.append(
                {
                    "batches": batches,
                    "gets": store.chunk_gets(),
                    "ds": ds.read_group,
                    "lsm": ds.statics["lsm"],
                    "bands": ds.read_group_bands,
                }
            )
    return out


@pytest.mark.parametrize(("world", "group"), [(2, 2), (4, 2), (4, 4), (6, 3)])
@pytest.mark.parametrize("last_batch", ["pad", "drop", "partial"])
def test_members_parts_concatenate_to_zarr_and_a_replica_reads_each_tile_once(path, world, group, last_batch) -> None:
    full = zarr.open_array(path / "x", mode="r")[:]
    ranks = _run(path, world, group, last_batch=last_batch)
    replicas = world // group
    seen: list[set[int]] = []
    for r in range(replicas):
        members = ranks[r * group : (r + 1) * group]
        assert [m["ds"].member for m in members] == list(range(group))
        assert {m["ds"].replica for m in members} == {r}
        n = len(members[0]["batches"])
        assert n > 0 and all(len(m["batches"]) == n for m in members)
        for b in range(n):
            idx = members[0]["batches"][b][0]
            for m in members[1:]:
                np.testing.assert_array_equal(m["batches"][b][0], idx)  # same samples, same order
            for label, shift in (("x", 0), ("y", 2)):
                parts = [m["batches"][b][1][label] for m in members]
                assert sum(p.shape[2] for p in parts) == LAT
                np.testing.assert_array_equal(np.concatenate(parts, axis=2), full[idx + shift])
            for m in members:  # a series without the dimension is read whole by every member
                np.testing.assert_array_equal(m["batches"][b][1]["s"], full[idx, 0, 0, 0])
        np.testing.assert_array_equal(np.concatenate([m["lsm"] for m in members], axis=0), full[0, 0])
        # each tile of x once per replica: the members' GETs add up to the distinct tiles they touched
        x_gets = [Counter({k: v for k, v in m["gets"].items() if k.startswith("x/")}) for m in members]
        total = sum(x_gets, Counter())
        assert total and set(total.values()) == {1}
        assert not set.intersection(*(set(g) for g in x_gets))
        for m, gets in zip(members, x_gets, strict=True):  # a member fetches its band's tiles only
            band = m["bands"]["latitude"]
            assert band.start % CHUNKS[2] == 0 and {int(k.split("/")[4]) for k in gets} == set(
                range(band.start // CHUNKS[2], -(-band.stop // CHUNKS[2]))
            )
        seen.append({int(i) // CHUNKS[0] for s, _, pad in members[0]["batches"] for i in _unpadded(s, pad)})
    if last_batch != "partial":  # partial may move a few samples between replicas (plan.distributed)
        for a in range(replicas):
            for b in range(a + 1, replicas):
                assert not (seen[a] & seen[b]), "replicas are dealt disjoint chunks"
    # across replicas no sample twice; under pad and partial every one of the split's samples (a repeat is marked)
    got = [i for r in range(replicas) for s, _, pad in ranks[r * group]["batches"] for i in _unpadded(s, pad)]
    assert len(got) == len(set(got))
    if last_batch != "drop":
        everything = _run(path, 1, 1, part=None, last_batch="partial")[0]["batches"]
        assert sorted(got) == sorted(i for s, _, _ in everything for i in s.tolist())


def _unpadded(indices: np.ndarray, padded: np.ndarray | None) -> list[int]:
    return indices.tolist() if padded is None else indices[~padded].tolist()


def test_a_group_of_all_ranks_reads_like_one_rank(path) -> None:
    alone = _run(path, 1, 1, part=None)[0]
    group = _run(path, 3, 3)
    for (i, _, _), (j, _, _) in zip(alone["batches"], group[0]["batches"], strict=True):
        np.testing.assert_array_equal(i, j)  # one replica: the order of a single rank
    x_alone = {k for k in alone["gets"] if k.startswith("x/")}
    x_group = Counter(k for g in group for k in g["gets"] if k.startswith("x/"))
    assert set(x_group) == x_alone and set(x_group.values()) == {1}


def test_explicit_isel_per_member(path) -> None:
    full = zarr.open_array(path / "x", mode="r")[:]
    parts = [{"longitude": slice(0, 4)}, {"longitude": slice(4, 6), "level": [1]}]
    ranks = _run(path, 2, 2, part=parts, split="val")
    for (i, a, _), (j, b, _) in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True):
        np.testing.assert_array_equal(i, j)
        np.testing.assert_array_equal(a["x"], full[i][..., :4])
        np.testing.assert_array_equal(b["x"], full[i][:, [1]][..., 4:])
    assert ranks[1]["ds"].describe({"longitude": slice(4, 6)})["part"] == {"longitude": [4, 6]}


@pytest.mark.parametrize("selection", [slice(None, None, -1), slice(2, 18), slice(1, 20)])  # the last: 9 + 10 rows
def test_a_band_cuts_what_a_selection_kept_at_its_tile_edges(path, selection) -> None:
    """Bands count within an earlier selection (reversed latitudes, a region), still one tile read per replica."""
    full = zarr.open_array(path / "x", mode="r")[:][:, :, selection]  # zarr reads, numpy reverses
    parts, gets = [], Counter()
    for rank in range(2):
        store = CountingStore(local_store(path))
        x = open_geometries(store)["x"].isel(latitude=selection)
        manifest = split_by_chunk(x, fractions=(0.8, 0.2))
        kw = {"rank": rank, "world_size": 2, "read_group_size": 2, "read_group_part": "latitude"}
        with InSituDataset(store, manifest, {"x": x}, batch_size=7, **kw) as ds:
            store.reset()
            parts.append([(b.sample_indices.copy(), np.array(b.arrays["x"])) for b in ds.val])
        gets.update(store.chunk_gets())
    assert gets and set(gets.values()) == {1}
    for (i, a), (j, b) in zip(*parts, strict=True):
        np.testing.assert_array_equal(i, j)
        np.testing.assert_array_equal(np.concatenate([a, b], axis=2), full[i])


def test_inference_with_groups(path) -> None:
    full = zarr.open_array(path / "x", mode="r")[:]
    got = []
    for rank in range(2):
        with _ds(str(path), rank, 2) as ds:
            got.append([(b.sample_indices.copy(), np.array(b.arrays["x"])) for b in ds.infer((10, 40))])
    assert [i for i, _ in got[0]] and all((i == j).all() for (i, _), (j, _) in zip(*got, strict=True))
    for (i, a), (_, b) in zip(*got, strict=True):
        np.testing.assert_array_equal(np.concatenate([a, b], axis=2), full[i])
    assert np.concatenate([i for i, _ in got[0]]).tolist() == list(range(10, 40))


def test_one_member_selects_nothing(path) -> None:
    with _ds(str(path), 0, 3, group=1) as ds:
        assert ds.read_group_bands == {} and ds.variables["x"].source == "x"


def test_describe_names_the_group_and_the_band(path) -> None:
    with _ds(str(path), 3, 4) as ds:
        info = ds.describe()["read_group"]
    assert info == {"size": 2, "member": 1, "replica": 1, "replicas": 2, "part": {"latitude": [10, 20]}}


def test_band_cuts_follow_tile_edges_and_spread_the_remainder_over_the_first_members() -> None:
    rows = np.arange(182)  # 181 latitudes in tiles of one row: numpy.array_split's shares
    assert np.diff(band_cuts(181, 4, rows)).tolist() == [46, 45, 45, 45]
    tiles46 = np.array([0, 46, 92, 138, 181])
    assert np.diff(band_cuts(181, 4, tiles46)).tolist() == [46, 46, 46, 43]
    tiles17 = np.array([*range(0, 181, 17), 181])  # each cut at the tile edge nearest 46, 91, 136
    assert band_cuts(181, 4, tiles17).tolist() == [0, 51, 85, 136, 181]
    one_tile = np.array([0, 181])  # fewer tiles than members: the even shares, tiles read by several
    assert np.diff(band_cuts(181, 4, one_tile)).tolist() == [46, 45, 45, 45]
    crowded = np.array([0, 1, 2, 3, 100])  # every member keeps at least one tile
    assert band_cuts(100, 4, crowded).tolist() == [0, 1, 2, 3, 100]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.integers(1, 12), st.data())
def test_band_cuts_are_increasing_tile_edges_near_the_even_shares(n, members, data) -> None:
    members = min(members, n)
    tile = data.draw(st.integers(1, n))
    edges = np.array(sorted({*range(0, n, tile), n}), dtype=np.int64)
    cuts = band_cuts(n, members, edges)
    assert cuts[0] == 0 and cuts[-1] == n and len(cuts) == members + 1 and (np.diff(cuts) > 0).all()
    even = np.cumsum([0, *[len(p) for p in np.array_split(np.arange(n), members)]])
    if len(edges) - 1 >= members:
        assert set(cuts.tolist()) <= set(edges.tolist())  # each tile read by one member
        # no cut is further from its even share than a tile, unless crowding forced it to the next free edge
        free = len(edges) - 1 == members
        assert free or (np.abs(cuts - even) <= tile).all()
    else:
        assert cuts.tolist() == even.tolist()


@pytest.mark.parametrize(
    ("kw", "exc", "words"),
    [
        ({"group": 4}, ValueError, ["world_size=6", "read_group_size=4"]),
        ({"part": "height"}, KeyError, ["'height'", "latitude", "longitude", "level"]),
        ({"part": None}, ValueError, ["read_group_part"]),
        ({"part": [{"latitude": slice(0, 5)}]}, ValueError, ["1 isel", "read_group_size=2"]),
        ({"part": 3}, TypeError, ["read_group_part", "int"]),
        ({"part": [{"height": 0}, {"height": 1}]}, KeyError, ["'height'", "latitude"]),
    ],
)
def test_bad_groups_are_named(path, kw, exc, words) -> None:
    with pytest.raises(exc) as info:
        _ds(str(path), 0, 6, **kw)
    for w in words:
        assert w in str(info.value)


def test_a_static_shorter_than_the_band_is_named(path) -> None:
    with pytest.raises(ValueError, match="'lsm'.*keeps 8 positions along 'latitude'"):
        store = str(path)
        g = open_geometries(store)
        lsm = {"lsm": open_statics(store)["lsm"].isel(latitude=slice(0, 8))}
        kw = {"rank": 1, "world_size": 2, "read_group_size": 2, "read_group_part": "latitude"}
        InSituDataset(store, split_by_chunk(g["x"], fractions=(1.0,)), {"x": g["x"]}, statics=lsm, **kw)


def test_too_few_positions_for_the_members(path) -> None:
    with pytest.raises(ValueError, match="6 positions, fewer than the read_group_size=8"):
        _ds(str(path), 0, 8, group=8, part="longitude")


@pytest.mark.parametrize(("before", "after"), [((4, 2), (4, 2)), ((4, 2), (2, 2)), ((4, 2), (6, 3)), ((2, 1), (4, 2))])
def test_resume_mid_epoch_with_groups_same_and_other_world_size(path, before, after) -> None:
    """A checkpoint of (world, G) resumed at another (world, G): every sample once, members still in lockstep."""
    k = 3
    states, consumed = [], []
    for rank in range(before[0]):
        with _ds(str(path), rank, before[0], before[1], part="latitude" if before[1] > 1 else None) as ds:
            ds.set_epoch(1)
            it = iter(ds.train)
            for _ in range(k):
                b = next(it)
                pad = b.extras.get("padded", np.zeros(len(b), bool))
                if ds.read_group.member == 0:
                    consumed.extend(b.sample_indices[~pad].tolist())
            states.append(json.loads(json.dumps(ds.train.state_dict())))
            it.close()
    assert all(s == states[0] for s in states) and states[0]["world_size"] == before[0] // before[1]
    full = zarr.open_array(path / "x", mode="r")[:]
    rest = []
    for rank in range(after[0]):
        with _ds(str(path), rank, after[0], after[1], part="latitude" if after[1] > 1 else None) as ds:
            ds.train.load_state_dict(states[0])
            mine = list(ds.train)
            if ds.read_group.member == 0:
                for b in mine:
                    pad = b.extras.get("padded", np.zeros(len(b), bool))
                    rest.extend(b.sample_indices[~pad].tolist())
            band = ds.read_group_bands["latitude"] if after[1] > 1 else slice(None)
            for b in mine:
                np.testing.assert_array_equal(b.arrays["x"], full[b.sample_indices][:, :, band])
    with _ds(str(path), 0, 1, 1, part=None) as one:
        one.set_epoch(1)
        everything = sorted(i for b in one.train for i in b.sample_indices.tolist())
    assert not set(consumed) & set(rest)
    assert sorted(set(consumed) | set(rest)) == sorted(set(everything))


@pytest.mark.parametrize(("world", "group"), [(2, 2), (4, 2)])
def test_the_servers_count_each_tile_once_per_replica(emulator, world, group) -> None:
    """GETs counted by the loopback object store: a replica's members together fetch each of x's tiles once."""
    _write(emulator.root / "g.zarr")
    url = emulator.url_for("g.zarr")

    def x_gets() -> Counter[str]:
        return Counter({k: v.gets for k, v in emulator.stats().keys.items() if k.split("/")[-6:-5] == ["x"]})

    emulator.reset_stats()
    with _ds(obstore_store(url, read_only=True), 0, 1, 1, part=None, hedge=False) as alone:
        list(alone.train)
    whole = x_gets()
    per_replica: list[Counter[str]] = [Counter() for _ in range(world // group)]
    for rank in range(world):
        emulator.reset_stats()
        with _ds(obstore_store(url, read_only=True), rank, world, group, hedge=False) as ds:
            list(ds.train)
            assert ds.train.last_pass.gets == ds.describe()["splits"]["train"]["gets"]  # the member's own share
        per_replica[rank // group].update(x_gets())
    for r, counts in enumerate(per_replica):
        assert counts and set(counts.values()) == {1}, f"replica {r} fetched a tile of x twice"
    if world == group:  # one replica fetches the tiles one rank alone fetches, split between its members
        assert counts == whole


WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch.distributed as dist
    import zarr
    sys.path.insert(0, sys.argv[3])  # this tree's insitubatch, not an installed one
    from insitubatch import InSituDataset, open_geometries, split_by_chunk

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]  # every rank makes every group
    x = open_geometries(sys.argv[1])["x"]
    with InSituDataset(
        sys.argv[1], split_by_chunk(x, fractions=(0.8, 0.2)), {"x": x}, batch_size=5, block_chunks=3,
        read_group_size=groups[rank // 2], read_group_part="latitude",
    ) as ds:
        band = ds.read_group_bands["latitude"]
        full = zarr.open_array(os.path.join(sys.argv[1], "x"), mode="r")[:]
        seen = []
        for batch in ds.train:
            assert (batch.arrays["x"] == full[batch.sample_indices][:, :, band]).all()
            seen.append(batch.sample_indices.tolist())
        out = {"rank": ds.rank, "world": ds.world_size, "member": ds.read_group.member,
               "replica": ds.read_group.replica, "band": [band.start, band.stop], "seen": seen}
    with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_a_torch_process_group_is_a_read_group_under_real_gloo(path, tmp_path) -> None:
    pytest.importorskip("torch")
    world = 4
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    codes = run_gloo_ranks(
        [sys.executable, str(script), str(path), str(tmp_path), str(Path(__file__).parents[2])], world, 180.0
    )
    assert codes == [0] * world
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert [(o["rank"], o["world"], o["replica"], o["member"]) for o in outs] == [
        (r, world, r // 2, r % 2) for r in range(world)
    ]
    assert [o["band"] for o in outs] == [[0, 10], [10, 20]] * 2
    assert outs[0]["seen"] == outs[1]["seen"] and outs[2]["seen"] == outs[3]["seen"]  # members in lockstep
    replicas = [{i // CHUNKS[0] for b in o["seen"] for i in b} for o in outs[::2]]
    assert len(outs[0]["seen"]) == len(outs[2]["seen"]) and not replicas[0] & replicas[1]
