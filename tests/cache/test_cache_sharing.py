"""One cache_dir shared by the ranks of a node: real processes, GETs counted at the store, every batch against zarr.

Ranks are separate interpreters (as under ``torchrun``, or ``multiprocessing``
spawn) with explicit ``rank``/``world_size``; the test process is their
barrier between epochs. Epoch 0 fetches each stored tile once across all
ranks (array ``b``'s chunks span two anchor chunks, so two ranks need each
of them: the second revives it, or waits for the first to finish it); epoch
1 reshuffles and issues no GET on any rank. A rank killed mid-write leaves
nothing a later run revives wrongly. The same under a real gloo group is the
slow test at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import CountingStore, cache_log_entries, local_store
from servers import free_port

from insitubatch import InSituDataset, open_geometries, split_by_chunk

TESTS = Path(__file__).parents[1]  # helpers
TIMEOUT_S = 120
# tiles in the fixture: a is 16 chunks of 2 tiles, b is 8 chunks of 1
TILES = 16 * 2 + 8

RANK = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[5])
    sys.path.insert(0, os.path.dirname(sys.argv[5]))  # this tree's insitubatch, not an installed one
    import numpy as np, zarr
    from helpers import CountingStore, assert_batch_matches, local_store
    from insitubatch import InSituDataset, open_geometries, split_by_chunk

    data, cache, rank, world, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[6]
    if kill != "none":  # die by SIGKILL in the middle of the 3rd chunk this rank persists
        from insitubatch.cache import DiskCache, ledger
        calls = []
        def dying(real):
            def wrapper(*args, **kwargs):
                calls.append(1)
                if len(calls) == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)
            return wrapper
        if kill == "before-publish":
            DiskCache.commit = dying(DiskCache.commit)
        else:  # published, its log line not yet written
            ledger.Ledger.append = dying(ledger.Ledger.append)
    store = CountingStore(local_store(data))
    geoms = open_geometries(store)
    truth = {p: zarr.open_array(data, path=p, mode="r")[:] for p in geoms}
    manifest = split_by_chunk(geoms["a"], fractions=(1.0,))
    with InSituDataset(store, manifest, geoms, batch_size=5, block_chunks=2, seed=1, rank=rank, world_size=world,
                       cache_dir=cache, persist=True) as ds:
        for epoch in range(2):
            if epoch:
                assert sys.stdin.readline().strip() == "go"  # every rank finished the epoch before
            ds.set_epoch(epoch)
            store.reset()
            it = iter(ds.train)
            for batch in it:
                assert_batch_matches(batch, geoms, truth)
            c = it.counters
            print(json.dumps({"epoch": epoch, "gets": dict(store.chunk_gets()), "revived": c.revived,
                              "from_others": c.revived_from_others, "batches": c.batches}), flush=True)
    """
)


@pytest.fixture
def data(tmp_path):
    root = zarr.open_group(tmp_path / "c.zarr", mode="w")
    rng = np.random.default_rng(0)
    root.create_array("a", shape=(64, 4, 6), chunks=(4, 2, 6), dtype="f4")[:] = rng.random((64, 4, 6), dtype="f4")
    root.create_array("b", shape=(64, 4, 6), chunks=(8, 4, 6), dtype="f4")[:] = rng.random((64, 4, 6), dtype="f4")
    return tmp_path / "c.zarr"


def _ranks(data: Path, cache: Path, world: int, kill: dict[int, str] | None = None) -> list[subprocess.Popen]:
    kill = kill or {}
    return [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(data), str(cache), str(r), str(world), str(TESTS), kill.get(r, "none")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for r in range(world)
    ]


def _epochs(procs: list[subprocess.Popen]) -> list[list[dict]]:
    """Run the ranks' two epochs with a barrier between them; ``[epoch][rank]`` reports."""
    first = [json.loads(p.stdout.readline() or "null") for p in procs]
    assert all(first), [p.communicate(timeout=TIMEOUT_S)[1] for p in procs]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    second = [json.loads(p.stdout.readline() or "null") for p in procs]
    for p in procs:
        _, err = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, err
    return [first, second]


def _run_shared(data: Path, cache: Path, world: int) -> None:
    epoch0, epoch1 = _epochs(_ranks(data, cache, world))
    gets = Counter()
    for report in epoch0:
        gets.update(report["gets"])
    assert len(gets) == TILES and set(gets.values()) == {1}, gets  # each tile fetched once, across all ranks
    assert sum(r["from_others"] for r in epoch0) > 0  # b's chunks: one rank fetched, another revived
    assert len({r["batches"] for r in epoch0}) == 1
    for report in epoch1:
        assert report["gets"] == {}, report  # zero GETs on every rank
        assert report["from_others"] > 0  # the reshuffle hands each rank chunks another rank made
    assert len(cache_log_entries(cache)) == 16 + 8  # one line per chunk in total, whoever wrote it


def test_two_ranks_share_one_cache_dir_across_epochs(data, tmp_path) -> None:
    _run_shared(data, tmp_path / "cache", 2)


@pytest.mark.slow
def test_four_ranks_share_one_cache_dir_across_epochs(data, tmp_path) -> None:
    _run_shared(data, tmp_path / "cache", 4)


@pytest.mark.invariant
@pytest.mark.parametrize("kill", ["before-publish", "before-log-line"])
def test_a_rank_killed_mid_write_leaves_nothing_revived_wrongly(data, tmp_path, kill) -> None:
    cache = tmp_path / "cache"
    survivor, victim = _ranks(data, cache, 2, kill={1: kill})
    _, err = victim.communicate(timeout=TIMEOUT_S)
    assert victim.returncode == -signal.SIGKILL, err
    first = json.loads(survivor.stdout.readline())  # the survivor finishes its epoch untroubled
    assert first["epoch"] == 0
    survivor.stdin.write("go\n")
    survivor.stdin.flush()
    _, err = survivor.communicate(timeout=TIMEOUT_S)  # and its second one, which needs the dead rank's chunks
    assert survivor.returncode == 0, err
    # a later run over the whole split: every batch equals zarr, and only logged chunks are revived
    store = CountingStore(local_store(data))
    geoms = open_geometries(store)
    logged = {(e["path"], e["chunk"]) for e in cache_log_entries(cache)}
    truth = {p: zarr.open_array(data, path=p, mode="r")[:] for p in geoms}
    with InSituDataset(
        store, split_by_chunk(geoms["a"], fractions=(1.0,)), geoms, batch_size=7, cache_dir=cache, persist=True
    ) as ds:
        store.reset()
        it = iter(ds.train)
        for batch in it:
            for label, g in geoms.items():
                np.testing.assert_array_equal(batch.arrays[label], truth[g.path][batch.read_indices(label)])
        assert it.counters.revived == len(logged)
        fetched = {(k.split("/")[0], int(k.split("/")[2])) for k in store.chunk_gets()}
        assert fetched.isdisjoint(logged)
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


GLOO_RANK = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[3])
    sys.path.insert(0, os.path.dirname(sys.argv[3]))
    import torch.distributed as dist, zarr
    from helpers import CountingStore, assert_batch_matches, local_store
    from insitubatch import InSituDataset, open_geometries, split_by_chunk

    dist.init_process_group("gloo", init_method="env://")
    store = CountingStore(local_store(sys.argv[1]))
    geoms = open_geometries(store)
    truth = {p: zarr.open_array(sys.argv[1], path=p, mode="r")[:] for p in geoms}
    reports = []
    with InSituDataset(store, split_by_chunk(geoms["a"], fractions=(1.0,)), geoms, batch_size=5, block_chunks=2,
                       cache_dir=sys.argv[2], persist=True) as ds:  # rank and world from the gloo group
        for epoch in range(2):
            ds.set_epoch(epoch)
            store.reset()
            it = iter(ds.train)
            for batch in it:
                assert_batch_matches(batch, geoms, truth)
            reports.append({"gets": dict(store.chunk_gets()), "from_others": it.counters.revived_from_others})
            dist.barrier()
    print(json.dumps(reports))
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ranks_of_a_gloo_group_share_one_cache_dir(data, tmp_path) -> None:
    pytest.importorskip("torch")
    world, port = 2, free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_RANK, str(data), str(tmp_path / "cache"), str(TESTS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "OMP_NUM_THREADS": "1",
            },
        )
        for rank in range(world)
    ]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    gets = Counter()
    for r in reports:
        gets.update(r[0]["gets"])
    assert len(gets) == TILES and set(gets.values()) == {1}
    assert all(r[1]["gets"] == {} and r[1]["from_others"] > 0 for r in reports)
