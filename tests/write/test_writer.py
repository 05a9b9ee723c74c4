"""SlotWriter: range validation, write intents checked before any byte, claims, heartbeat, coverage."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import obstore.store
import pytest
import zarr
from write_helpers import ALIGNMENT, EXTENT, GROUP, ManualClock, layout_spec, predictions, store_bytes, write_batches
from zarr.storage import LocalStore, MemoryStore, ObjectStore

from insitubatch.errors import SlotAlignmentError, WriteClaimError, WriteIntentRangeError
from insitubatch.write import (
    LayoutSpec,
    OutputArray,
    SlotWriter,
    clear_coverage,
    clear_stale_claims,
    create_layout,
    write_status,
)

# No heartbeat fires during a test that compares store bytes.
QUIET_HEARTBEAT_S = 600.0
QUIET_STALE_AFTER_S = 1200.0
# Fast heartbeats for the tests about them.
FAST_HEARTBEAT_S = 0.05
FAST_STALE_AFTER_S = 0.3


def _make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> zarr.abc.store.Store:
    if kind == "memory":
        store = MemoryStore()
    elif kind == "local":
        store = LocalStore(tmp_path / "o.zarr")
    elif kind == "obstore-local":
        store = ObjectStore(obstore.store.LocalStore(tmp_path / "o.zarr", mkdir=True))
    else:
        store = request.getfixturevalue("write_s3_store")
    create_layout(store, layout_spec(), group=GROUP)
    return store


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> zarr.abc.store.Store:
    """A store for validation tests (claims work the same on every store)."""
    return _make_store(request.param, request, tmp_path)


@pytest.fixture(params=["memory", "local", "obstore-local", "s3"])
def claim_store(request: pytest.FixtureRequest, tmp_path: Path) -> zarr.abc.store.Store:
    """Every way claims are made: dict check-and-set, link(2), obstore create + compare, S3 preconditions."""
    return _make_store(request.param, request, tmp_path)


def _quiet(store: zarr.abc.store.Store, start: int, stop: int, **options: object) -> SlotWriter:
    return SlotWriter(
        store, start, stop, group=GROUP, heartbeat_s=QUIET_HEARTBEAT_S, stale_after_s=QUIET_STALE_AFTER_S, **options
    )


# -- range validation ---------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "stop", "message"),
    [
        (-12, 12, "0 <= start < stop"),
        (12, 12, "0 <= start < stop"),
        (24, 12, "0 <= start < stop"),
        (36, 48, "past the indexed extent 44"),
        (6, 24, r"not aligned to 12.*Nearest aligned range containing it: \[0, 24\)"),
        (12, 30, r"Nearest aligned range containing it: \[12, 36\)"),
        (38, 44, r"Nearest aligned range containing it: \[36, 44\)"),
    ],
)
def test_range_validation_suggests_the_nearest_aligned_range(store, start: int, stop: int, message: str) -> None:
    with pytest.raises(SlotAlignmentError, match=message):
        SlotWriter(store, start, stop, group=GROUP).open()
    assert write_status(store, GROUP).claims == ()  # refused before claiming


def test_partial_final_chunk_range_is_accepted(store) -> None:
    with SlotWriter(store, 36, EXTENT, group=GROUP) as writer:
        write_batches(writer)
    assert write_status(store, GROUP).completed == ((36, EXTENT),)


def test_shard_sharing_ranges_are_rejected_by_the_writer() -> None:
    """Aligned to the inner chunk (2) but not to the shard (6): two writers would rewrite one shard."""
    store = MemoryStore()
    create_layout(store, LayoutSpec((OutputArray("pred", (24, 4), (2, 4), "f4", shards=(6, 4)),)))
    for start, stop in [(0, 2), (2, 4), (4, 8), (8, 12)]:
        with pytest.raises(SlotAlignmentError, match="shard 6"):
            SlotWriter(store, start, stop).open()
    with SlotWriter(store, 6, 12) as writer:
        writer.write("pred", (6, 12), np.ones((6, 4), "f4"))


# -- write intents ------------------------------------------------------------
@pytest.mark.parametrize(
    ("array", "index_range", "shape", "error", "message"),
    [
        ("pred", (20, 25), (5, 3, 8), WriteIntentRangeError, r"\[20, 25\) leaves this writer's slot \[12, 24\)"),
        ("pred", (8, 14), (6, 3, 8), WriteIntentRangeError, "leaves this writer's slot"),
        ("pred", (24, 30), (6, 3, 8), WriteIntentRangeError, "leaves this writer's slot"),
        ("count", (0, 44), (44,), WriteIntentRangeError, "leaves this writer's slot"),
        ("x", (12, 14), (2,), WriteIntentRangeError, "written once by the coordinator"),
        ("nope", (12, 14), (2,), WriteIntentRangeError, r"only \['count', 'pred'\]"),
        ("pred", slice(12, 20, 2), (4, 3, 8), WriteIntentRangeError, "step 1"),
        ("pred", (12, 14), (2, 3, 7), ValueError, r"expected \(2, 3, 8\)"),
    ],
)
@pytest.mark.invariant
def test_bad_write_raises_before_any_byte_is_written(
    store, array: str, index_range: object, shape: tuple[int, ...], error: type, message: str
) -> None:
    with _quiet(store, 12, 24) as writer:
        writer.write("pred", (12, 14), predictions(12, 14)["pred"])  # a good write first
        before = store_bytes(store)
        with pytest.raises(error, match=message):
            writer.write(array, index_range, np.full(shape, 7, "f4"))
        assert store_bytes(store) == before  # every key, every byte, unchanged
        writer.write("pred", slice(14, 24), predictions(14, 24)["pred"])
        writer.write("count", (12, 24), predictions(12, 24)["count"])
    np.testing.assert_array_equal(zarr.open_array(store, path=f"{GROUP}/pred")[12:24], predictions(12, 24)["pred"])


def test_write_intent_error_is_an_index_error(store) -> None:
    with _quiet(store, 0, 12) as writer, pytest.raises(IndexError):
        writer.write("count", (11, 13), np.zeros(2, "i4"))


def test_write_on_an_axis_other_than_zero(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "o.zarr")
    create_layout(store, LayoutSpec((OutputArray("t", (2, 30), (2, 5), "i4", shards=(2, 10), index_axis=1),)))
    with SlotWriter(store, 10, 20) as writer:
        writer.write("t", (10, 20), np.arange(20).reshape(2, 10))
        with pytest.raises(WriteIntentRangeError):
            writer.write("t", (0, 10), np.zeros((2, 10), "i4"))
    np.testing.assert_array_equal(zarr.open_array(store, path="t")[:, 10:20], np.arange(20).reshape(2, 10))


def test_writer_must_be_open() -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    writer = SlotWriter(store, 0, 12, group=GROUP)
    with pytest.raises(RuntimeError, match="not open"):
        writer.write("count", (0, 1), np.zeros(1, "i4"))


# -- claims and coverage ------------------------------------------------------
def test_clean_exit_records_coverage_then_releases(claim_store) -> None:
    with _quiet(claim_store, 0, 12, worker_id="w0") as writer:
        status = write_status(claim_store, GROUP)
        assert [(c.start, c.stop, c.worker_id) for c in status.claims] == [(0, 12, "w0")]
        assert status.coverage == ()
    status = write_status(claim_store, GROUP)
    assert status.claims == () and [(c.start, c.stop, c.worker_id) for c in status.coverage] == [(0, 12, "w0")]
    assert writer.coverage is not None and writer.coverage.start == 0
    with pytest.raises(WriteClaimError, match="released"):
        writer.write("count", (0, 1), np.zeros(1, "i4"))


def test_exception_releases_the_claim_without_coverage(claim_store) -> None:
    with pytest.raises(RuntimeError, match="model failed"), _quiet(claim_store, 0, 12):
        raise RuntimeError("model failed")
    status = write_status(claim_store, GROUP)
    assert status.claims == () and status.coverage == ()


def test_overlapping_live_claim_refuses_unless_forced(claim_store) -> None:
    with _quiet(claim_store, 0, 24, worker_id="holder"):
        for start, stop in [(0, 24), (0, 12), (12, 24), (12, 36)]:
            with pytest.raises(WriteClaimError, match=r"claimed by 'holder'.*live"):
                _quiet(claim_store, start, stop).open()
        assert len(write_status(claim_store, GROUP).claims) == 1  # refused claimants left nothing
        with _quiet(claim_store, 0, 12, force=True):
            pass


def test_completed_coverage_refuses_rewrite_unless_forced_or_cleared(claim_store) -> None:
    with _quiet(claim_store, 0, 12):
        pass
    with pytest.raises(WriteClaimError, match=r"already completed.*clear_coverage"):
        _quiet(claim_store, 0, 24).open()
    assert write_status(claim_store, GROUP).claims == ()
    with _quiet(claim_store, 0, 12, force=True, worker_id="again"):
        pass
    assert [c.worker_id for c in write_status(claim_store, GROUP).coverage] == ["again"]
    assert [(c.start, c.stop) for c in clear_coverage(claim_store, 0, 24, group=GROUP)] == [(0, 12)]
    with _quiet(claim_store, 0, 24):
        pass


def test_heartbeat_refreshes_the_claim(claim_store) -> None:
    # a looser threshold than FAST_*: a loaded machine must not make a live claim look stale
    stale_after_s = 12 * FAST_HEARTBEAT_S
    with SlotWriter(claim_store, 0, 12, group=GROUP, heartbeat_s=FAST_HEARTBEAT_S, stale_after_s=stale_after_s):
        first = write_status(claim_store, GROUP).claims[0].heartbeat_at
        deadline = time.monotonic() + 10 * stale_after_s
        while write_status(claim_store, GROUP).claims[0].heartbeat_at == first:
            assert time.monotonic() < deadline, "no heartbeat landed"
            time.sleep(FAST_HEARTBEAT_S)
        time.sleep(1.5 * stale_after_s)
        assert write_status(claim_store, GROUP).stale_claims == ()  # alive, so never stale


def test_claim_cleared_under_a_writer_is_noticed(claim_store) -> None:
    writer = SlotWriter(claim_store, 0, 12, group=GROUP, heartbeat_s=FAST_HEARTBEAT_S, stale_after_s=FAST_STALE_AFTER_S)
    writer.open()
    # pretend the writer looked dead: another process clears and takes the range
    later = time.time() + 10 * FAST_STALE_AFTER_S
    assert len(clear_stale_claims(claim_store, GROUP, now=later)) == 1
    thief = _quiet(claim_store, 0, 12, worker_id="thief").open()
    deadline = time.monotonic() + 10 * FAST_STALE_AFTER_S
    while writer.lost is None:
        assert time.monotonic() < deadline, "the writer never noticed"
        time.sleep(FAST_HEARTBEAT_S)
    with pytest.raises(WriteClaimError, match="lost the claim"):
        writer.write("count", (0, 1), np.zeros(1, "i4"))
    with pytest.raises(WriteClaimError, match="lost the claim"):
        writer.complete()
    assert [c.worker_id for c in write_status(claim_store, GROUP).claims] == ["thief"]  # left alone
    thief.complete()


def test_stalled_writer_refuses_to_write(claim_store) -> None:
    """A process that stalled past its staleness threshold may have been taken over: it stops."""
    clock = ManualClock()
    writer = _quiet(claim_store, 0, 12, clock=clock)
    writer.open()
    writer.write("count", (0, 1), np.zeros(1, "i4"))
    clock.advance(QUIET_STALE_AFTER_S - 1)
    writer.write("count", (1, 2), np.zeros(1, "i4"))  # silent, but not yet for stale_after_s
    clock.advance(2)  # a long GC pause or a frozen VM: no heartbeat could land
    with pytest.raises(WriteClaimError, match="no heartbeat landed"):
        writer.write("count", (1, 2), np.zeros(1, "i4"))
    writer.close()
    assert write_status(claim_store, GROUP).claims == ()


def test_take_over_stale_claim(claim_store) -> None:
    clock = ManualClock()
    dead = _quiet(claim_store, 0, 24, clock=clock).open()
    dead._claim._stop_heartbeat()  # a hung process: no more heartbeats
    with pytest.raises(WriteClaimError, match="live.*wait for it to finish"):
        _quiet(claim_store, 0, 24, clock=clock).open()
    clock.advance(QUIET_STALE_AFTER_S + 1)
    with pytest.raises(WriteClaimError, match="stale.*clear-stale"):
        _quiet(claim_store, 0, 24, clock=clock).open()
    with pytest.raises(WriteClaimError, match="stale"):
        _quiet(claim_store, 0, 12, clock=clock).open()
    with _quiet(claim_store, 0, 12, take_over_stale=True, worker_id="new", clock=clock):  # overlapping, different range
        assert [c.worker_id for c in write_status(claim_store, GROUP).claims] == ["new"]
    assert write_status(claim_store, GROUP).completed == ((0, 12),)


def test_same_range_stale_claim_take_over(claim_store) -> None:
    clock = ManualClock()
    dead = _quiet(claim_store, 12, 24, clock=clock).open()
    dead._claim._stop_heartbeat()
    clock.advance(QUIET_STALE_AFTER_S + 1)
    with _quiet(claim_store, 12, 24, take_over_stale=True, clock=clock):
        pass
    assert write_status(claim_store, GROUP).completed == ((12, 24),)


def test_bad_heartbeat_settings(store) -> None:
    with pytest.raises(ValueError, match="stale_after_s"):
        SlotWriter(store, 0, 12, group=GROUP, heartbeat_s=5, stale_after_s=5).open()
    with pytest.raises(ValueError, match="heartbeat_s"):
        SlotWriter(store, 0, 12, group=GROUP, heartbeat_s=0).open()


def test_read_only_or_unclaimable_store_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "o.zarr")
    create_layout(store, layout_spec(), group=GROUP)
    with pytest.raises(WriteClaimError, match="read-only"):
        SlotWriter(LocalStore(tmp_path / "o.zarr", read_only=True), 0, 12, group=GROUP).open()

    wrapped = zarr.storage.LoggingStore(MemoryStore())
    create_layout(wrapped, layout_spec(), group=GROUP)
    with SlotWriter(wrapped, 0, 12, group=GROUP):  # wrappers are unwrapped to the store below
        pass

    from zarr.storage import ZipStore

    from insitubatch.write.claims import SlotClaim

    zipped = ZipStore(tmp_path / "o.zip", mode="w")  # zip entries cannot be created exclusively
    with pytest.raises(WriteClaimError, match="ZipStore cannot create a record atomically"):
        SlotClaim.acquire(zipped, 0, 12, group=GROUP)


def test_from_env(store, tmp_path: Path) -> None:
    env = {"INSITUBATCH_SLOT_START": "24", "INSITUBATCH_SLOT_STOP": "36", "INSITUBATCH_SLOT_GROUP": GROUP}
    with SlotWriter.from_env(store, env=env) as writer:
        assert (writer.start, writer.stop, writer.group) == (24, 36, GROUP)
        write_batches(writer)
    with pytest.raises(KeyError, match="INSITUBATCH_STORE"):
        SlotWriter.from_env(env=env)
    from insitubatch.write import plan_slots

    plan = plan_slots(store, group=GROUP)
    with pytest.raises(ValueError, match="assigned 2 ranges"):
        SlotWriter.from_env(store, env={"RANK": "0", "WORLD_SIZE": "2"}, plan=plan)
    with SlotWriter.from_env(store, env={"RANK": "1", "WORLD_SIZE": str(len(plan))}, plan=plan) as writer:
        assert (writer.start, writer.stop) == (plan.ranges[1].start, plan.ranges[1].stop)


def test_from_env_opens_a_store_url(tmp_path: Path) -> None:
    pytest.importorskip("insitubatch.stores.obstore_stores")
    path = tmp_path / "o.zarr"
    create_layout(LocalStore(path), layout_spec(), group=GROUP)
    env = {
        "INSITUBATCH_SLOT_START": "0",
        "INSITUBATCH_SLOT_STOP": str(ALIGNMENT),
        "INSITUBATCH_SLOT_GROUP": GROUP,
        "INSITUBATCH_STORE": str(path),
    }
    with SlotWriter.from_env(env=env) as writer:
        write_batches(writer)
    assert write_status(LocalStore(path), GROUP).completed == ((0, ALIGNMENT),)
