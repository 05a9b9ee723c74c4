"""Passes over a remote store: the self-tuning window, silent GETs, dead objects and teardown, against zarr's read.

A zarr group (a 2-tile array and a sharded one) is served by the loopback
emulator over HTTP; every batch is checked against zarr-python's read of
the same arrays.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import zarr
from helpers import assert_batch_matches, smooth_field, write_array
from zarr.errors import ZarrUserWarning

from insitubatch._engine.reads.store_link import STALL_FLOOR_S, client_for
from insitubatch.dataset import InSituDataset
from insitubatch.errors import StoreReadError
from insitubatch.io.group import open_geometries
from insitubatch.plan.sizing import auto_inflight_cap
from insitubatch.plan.splits import split_by_chunk
from insitubatch.stores.obstore_stores import DEFAULT_RETRY, DEFAULT_RETRY_TIMEOUT, obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.stores.read_policy import ReadPolicy

GROUP = "n.zarr"
SHAPE = (64, 6, 8)
BATCH_SIZE = 5
# a loaded 2-core CI machine: every time bound below carries this on top of what the rules promise
SLACK_S = 3.0
# The retry window the end-to-end of a dead object configures in place of the default's 45 s.
SHORT_RETRY_TIMEOUT_S = 5.0
# How a read that gave up says so: "gave up on 'k' after 3 attempt(s) in 5.0s; the last: ..."
GAVE_UP = re.compile(r"after (\d+) attempt\(s\) in ")


class Served:
    def __init__(self, emu) -> None:
        rng = np.random.default_rng(3)
        root = zarr.open_group(emu.root / GROUP, mode="w")
        write_array(root, "v", smooth_field(rng, SHAPE), (4, 3, 8))
        write_array(root, "s", smooth_field(rng, SHAPE), (2, 3, 8), shards=(4, 6, 8))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ZarrUserWarning)
            zarr.consolidate_metadata(root.store)
        local = zarr.open_group(emu.root / GROUP, mode="r")
        self.emu = emu
        self.data = {name: local[name][...] for name in ("v", "s")}
        reader = obstore_store(emu.url_for(GROUP), read_only=True)
        self.geoms = open_geometries(reader)
        close_store(reader)
        self.manifest = split_by_chunk(self.geoms["v"], fractions=(0.75, 0.25))

    def store(self, **kw: Any):
        return obstore_store(self.emu.url_for(GROUP), read_only=True, **kw)

    def key(self, path: str, chunk: int, tile: int = 0) -> str:
        g = self.geoms[path]
        return g.chunk_key(g.physical_chunk_coord(chunk, tile))


@pytest.fixture
def served(emulator) -> Served:
    emulator.configure(latency_s=0.003, jitter_s=0.001)
    return Served(emulator)


def _give_up_window(policy: ReadPolicy, attempts: int) -> tuple[float, float]:
    """When a read of a key that never answers gives up after ``attempts``, by the retry loop's rules.

    It gives up once the next retry's backoff would end past the window (so
    no earlier than the window less that backoff), and its last silent
    attempt is cut at the window's end or after the stall floor (so no later
    than the window plus the floor).
    """
    return policy.retry_timeout_s - policy.backoff(attempts + 1), policy.retry_timeout_s + STALL_FLOOR_S


def _check_epoch(ds: InSituDataset, served: Served, split: str = "train"):
    it = iter(ds.split(split))
    n = 0
    for batch in it:
        assert_batch_matches(batch, ds.variables, served.data)
        n += 1
    assert n == len(ds.split(split))
    return it.stats


def test_auto_is_the_default_and_reports_what_it_chose(served: Served, caplog) -> None:
    store = served.store()
    with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2) as ds:
        assert ds.max_inflight == "auto" and ds.hedge is True
        with caplog.at_level(logging.INFO, logger="insitubatch"):
            stats = _check_epoch(ds, served)
        assert stats.inflight_auto and stats.inflight_min <= stats.inflight_median <= stats.inflight_max
        assert stats.inflight_max <= ds.describe()["concurrency"]["cap"]
        assert "max_inflight auto" in caplog.text and "hedged" in caplog.text
        info = ds.describe()
        tile = max(g.stored_chunk_nbytes for g in served.geoms.values())
        assert info["knobs"]["max_inflight"] == "auto"
        assert info["memory"]["inflight_tiles"] == auto_inflight_cap(tile) and info["memory"]["inflight_auto"]
        assert info["concurrency"]["cap"] == auto_inflight_cap(tile)
        assert info["concurrency"]["history"] is not None and info["concurrency"]["hedge"] is True
    close_store(store)


def test_a_pinned_max_inflight_is_what_the_pass_reports(served: Served) -> None:
    store = served.store()
    with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, max_inflight=3) as ds:
        stats = _check_epoch(ds, served)
        assert not stats.inflight_auto and stats.max_inflight == stats.inflight_max == 3
        assert stats.inflight_depth_max <= 3
        assert ds.describe()["concurrency"] == {
            "max_inflight": 3,
            "cap": 3,
            "limit": 3,
            "history": None,
            "throttled": 0,
            "throttle_cuts": 0,
            "hedge": True,
        }
    close_store(store)


def test_datasets_on_one_store_share_one_controller(served: Served) -> None:
    a, b = served.store(), served.store()
    with (
        InSituDataset(a, served.manifest, batch_size=BATCH_SIZE, block_chunks=2) as ds_a,
        InSituDataset(b, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, rank=1, world_size=2) as ds_b,
    ):
        for ta, tb in zip(ds_a.train, ds_b.train):  # two passes open at once, on two datasets
            assert_batch_matches(ta, ds_a.variables, served.data)
            assert_batch_matches(tb, ds_b.variables, served.data)
        window_a, window_b = ds_a.context.permits().window, ds_b.context.permits().window
        assert window_a is window_b and window_a.controller is not None
        assert window_a.inflight == 0
    close_store(a)
    close_store(b)


def test_knobs_are_checked(served: Served) -> None:
    store = served.store()
    with pytest.raises(ValueError, match='max_inflight=.fast. must be "auto" or a positive int'):
        InSituDataset(store, served.manifest, max_inflight="fast")
    with pytest.raises(ValueError, match="max_inflight=0"):
        InSituDataset(store, served.manifest, max_inflight=0)
    with pytest.raises(TypeError, match="hedge must be True or False"):
        InSituDataset(store, served.manifest, hedge="yes")
    close_store(store)


def test_a_get_held_open_forever_is_retried_and_the_pass_equals_zarr(served: Served) -> None:
    store = served.store()
    seconds = []
    for hold in (False, True):  # a fresh dataset each time: the second pass must fetch again
        if hold:
            served.emu.configure(hold_key=f"{GROUP}/{served.key('v', 5, 1)}", hold_times=1)
        with InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, hedge=False) as ds:
            t0 = time.perf_counter()
            stats = _check_epoch(ds, served)
            seconds.append(time.perf_counter() - t0)
    assert stats.stalls == 1 and stats.retries == 1
    assert seconds[1] < seconds[0] + STALL_FLOOR_S + SLACK_S
    assert served.emu.stats().held == 1
    close_store(store)


@pytest.mark.slow
def test_a_dead_object_raises_store_read_error_naming_its_key_within_the_retry_timeout(served: Served) -> None:
    """The default path with one setting shortened, the retry window: the read gives up at the window's end.

    The default window (45 s) is checked by this rule's arithmetic, in the next test.
    """
    retry_timeout = SHORT_RETRY_TIMEOUT_S
    key = served.key("s", 7)
    served.emu.configure(hold_key=f"{GROUP}/{key}")
    store = served.store(retry={"retry_timeout": timedelta(seconds=retry_timeout)})
    policy = client_for(store).policy
    assert policy == replace(ReadPolicy(), retry_timeout_s=retry_timeout)  # every other bound is the default's
    ds = InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2, shuffle=False)
    t0 = time.perf_counter()
    with pytest.raises(StoreReadError, match=f"key {key!r}") as info:
        for batch in ds.train:
            assert_batch_matches(batch, ds.variables, served.data)
    elapsed = time.perf_counter() - t0
    assert "gave up" in str(info.value) and "no answer" in str(info.value)
    attempts = int(GAVE_UP.search(str(info.value)).group(1))
    earliest, latest = _give_up_window(policy, attempts)
    assert earliest < elapsed < latest + SLACK_S, (attempts, elapsed)
    t0 = time.perf_counter()
    ds.close()  # nothing waits on the dead object any more
    close_store(store)
    assert time.perf_counter() - t0 < SLACK_S


def test_with_default_settings_a_dead_object_raises_within_a_minute(served: Served) -> None:
    """A store built with no retry setting gets the default bounds (45 s, not obstore's 3 min), and the rule
    the end-to-end above checks on a short window puts the default's give-up within a minute."""
    store = served.store()
    policy = client_for(store).policy
    close_store(store)
    assert policy == ReadPolicy()
    assert policy.retry_timeout_s == DEFAULT_RETRY_TIMEOUT.total_seconds() == 45.0
    assert policy.max_retries == DEFAULT_RETRY["max_retries"]
    _, latest = _give_up_window(policy, attempts=policy.max_retries + 1)
    assert latest + SLACK_S < 60.0


def test_closing_during_a_silent_get_does_not_wait_for_it(served: Served) -> None:
    served.emu.configure(hold_key=f"{GROUP}/*/c/*")  # no chunk answers at all
    store = served.store()
    ds = InSituDataset(store, served.manifest, batch_size=BATCH_SIZE, block_chunks=2)
    it = iter(ds.train)
    deadline = time.monotonic() + SLACK_S
    while served.emu.stats().held == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.perf_counter()
    it.close()
    ds.close()
    close_store(store)
    assert time.perf_counter() - t0 < SLACK_S
