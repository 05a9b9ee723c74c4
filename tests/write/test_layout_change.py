"""A layout change during a parallel write: refused at open, at the next write, or at completion; nothing recorded.

The slot plan's alignment rests on the indexed arrays' shape, chunks, shards,
dtype and codecs and on the group's layout record. These tests change them
under writers (in this process, and under spawned worker processes on a local
directory and on moto S3) and check that the writer refuses with an error
naming the array, the slot and the changed fact, records no coverage, and
that a resume plan after the coordinator's fix writes the slot again to the
single-writer bytes.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path

import pytest
import zarr
from layout_change_helpers import (
    CHANGES,
    EXIT_CHANGED,
    paused_worker,
    recreate,
    resize_pred,
    respec,
    restore,
    write_span,
)
from write_helpers import (
    ALIGNMENT,
    BATCH,
    EXTENT,
    GROUP,
    WORKER_TIMEOUT_S,
    array_bytes,
    join_all,
    layout_spec,
    reference_store,
    store_bytes,
)
from zarr.abc.store import Store
from zarr.storage import LocalStore, MemoryStore

from insitubatch.errors import LayoutChangedError, LayoutMismatchError, SlotAlignmentError, WriteBehindError
from insitubatch.write import SlotWriter, create_layout, plan_slots, write_status
from insitubatch.write.layout import LAYOUT_ATTRIBUTE

SPAWN = multiprocessing.get_context("spawn")
# The slot the in-process tests write: one alignment unit, three writes of BATCH per array.
SLOT = (0, ALIGNMENT)


@pytest.fixture(scope="module")
def reference() -> dict[str, bytes]:
    return array_bytes(reference_store())


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    made: Store = MemoryStore() if request.param == "memory" else LocalStore(tmp_path / "o.zarr")
    create_layout(made, layout_spec(), group=GROUP)
    return made


def _delete_array(store: Store, name: str) -> None:
    del zarr.open_group(store, path=GROUP)[name]


def _set_record(store: Store, **changes: object) -> None:
    root = zarr.open_group(store, path=GROUP)
    root.update_attributes({LAYOUT_ATTRIBUTE: {**root.attrs[LAYOUT_ATTRIBUTE], **changes}})


def _records(store: Store, kind: str) -> list[str]:
    """The claim or coverage records in the store (read by key: ``write_status`` refuses a changed layout)."""
    return [k for k in store_bytes(store, f"{GROUP}/.insitubatch/{kind}/") if k.count("/") == 4]


def _nothing_recorded(store: Store) -> None:
    assert _records(store, "claims") == [] and _records(store, "coverage") == []


# -- changed between plan and open --------------------------------------------
@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda s: recreate(s, "count", chunks=(8,)), SlotAlignmentError, r"not aligned to 24.*count: chunk 8"),
        (lambda s: recreate(s, "pred", shards=(8, 3, 8)), SlotAlignmentError, r"not aligned to 8.*shard 8"),
        (lambda s: resize_pred(s, EXTENT + 6), LayoutMismatchError, "extent must stay fixed"),
        (lambda s: _delete_array(s, "count"), LayoutMismatchError, "'count' of group='out' is missing"),
        (lambda s: _set_record(s, version=99), LayoutMismatchError, "no insitubatch write layout"),
    ],
    ids=["rechunk", "reshard", "resize", "delete-array", "delete-record"],
)
def test_a_change_between_plan_and_open_is_refused_at_open(
    store: Store, change: Callable[[Store], None], error: type[Exception], message: str
) -> None:
    plan = plan_slots(store, group=GROUP)
    change(store)
    r = plan.ranges[1]  # [12, 24): aligned to 12, not to the new alignment (24 or 8)
    with pytest.raises(error, match=message):
        SlotWriter(store, r.start, r.stop, group=GROUP).open()
    _nothing_recorded(store)  # refused before claiming


def test_a_change_that_keeps_the_range_aligned_is_written_under_the_new_layout(store: Store) -> None:
    plan = plan_slots(store, group=GROUP)
    recreate(store, "count", chunks=(3,))  # alignment 6 divides the planned 12: every writer still owns its chunks
    r = plan.ranges[1]
    with SlotWriter(store, r.start, r.stop, group=GROUP) as writer:
        write_span(writer, r.start, r.stop)
    count = zarr.open_array(store, path=f"{GROUP}/count")
    assert count.chunks == (3,)
    assert count[r.start : r.stop].tolist() == [i * 7 + 1 for i in range(r.start, r.stop)]


# -- changed while a writer is mid-slot -----------------------------------------
@pytest.mark.parametrize(
    ("change", "array", "fact"),
    [
        (lambda s: recreate(s, "count", chunks=(8,)), "count", "chunk_grid"),
        (lambda s: recreate(s, "count", dtype="int64"), "count", "data_type"),
        (lambda s: recreate(s, "pred", shards=(12, 3, 8)), "pred", "'chunk_shape': [12, 3, 8]"),
        (lambda s: resize_pred(s, EXTENT + 6), "pred", "shape"),
        (lambda s: _delete_array(s, "count"), "count", "deleted"),
    ],
    ids=["rechunk", "dtype", "reshard", "resize", "delete-array"],
)
@pytest.mark.parametrize("depth", [0, 2], ids=["sync", "write-behind"])
def test_a_change_mid_slot_refuses_the_next_write_and_records_nothing(
    store: Store, change: Callable[[Store], None], array: str, fact: str, depth: int
) -> None:
    expected = WriteBehindError if depth else LayoutChangedError
    with pytest.raises(expected) as info:
        with SlotWriter(store, *SLOT, group=GROUP, write_behind=depth) as writer:
            write_span(writer, SLOT[0], BATCH)
            writer.flush()
            change(store)
            write_span(writer, BATCH, SLOT[1])
    changed = info.value.__cause__ if depth else info.value
    assert isinstance(changed, LayoutChangedError)
    assert f"slot [{SLOT[0]}, {SLOT[1]})" in str(changed) and f"before writing {array!r}" in str(changed)
    assert len(changed.diff) >= 1 and all(line.startswith(f"{array}: ") for line in changed.diff)
    assert fact in "\n".join(changed.diff)
    _nothing_recorded(store)


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (lambda s: recreate(s, "count", chunks=(8,)), "count: chunk_grid was"),
        (lambda s: _set_record(s, extent=EXTENT + 6), f"layout record ({LAYOUT_ATTRIBUTE}): was"),
    ],
    ids=["rechunk", "record"],
)
@pytest.mark.parametrize("depth", [0, 2], ids=["sync", "write-behind"])
def test_a_change_after_the_last_write_refuses_completion(
    store: Store, change: Callable[[Store], None], line: str, depth: int
) -> None:
    writer = SlotWriter(store, *SLOT, group=GROUP, write_behind=depth).open()
    write_span(writer, *SLOT)
    writer.flush()
    change(store)
    with pytest.raises(LayoutChangedError, match=r"slot \[0, 12\) \(seen before recording the slot complete\)") as info:
        writer.complete()
    assert any(d.startswith(line) for d in info.value.diff)
    assert writer.coverage is None
    _nothing_recorded(store)


def test_attributes_are_no_layout_change(store: Store, reference: dict[str, bytes]) -> None:
    with SlotWriter(store, 0, EXTENT, group=GROUP) as writer:
        write_span(writer, 0, BATCH)
        zarr.open_array(store, path=f"{GROUP}/pred").update_attributes({"units": "K"})
        write_span(writer, BATCH, EXTENT)
    assert write_status(store, GROUP).completed == ((0, EXTENT),)
    assert {k: v for k, v in array_bytes(store).items() if k != f"{GROUP}/pred/zarr.json"} == {
        k: v for k, v in reference.items() if k != f"{GROUP}/pred/zarr.json"
    }


@pytest.mark.parametrize("depth", [0, 2], ids=["sync", "write-behind"])
def test_after_the_fix_a_resume_plan_writes_the_refused_slot_again(
    store: Store, reference: dict[str, bytes], depth: int
) -> None:
    with pytest.raises((LayoutChangedError, WriteBehindError)):
        with SlotWriter(store, 0, EXTENT, group=GROUP, write_behind=depth) as writer:
            write_span(writer, 0, 2 * BATCH)
            writer.flush()
            recreate(store, "count", chunks=(8,))
            write_span(writer, 2 * BATCH, EXTENT)
    restore(store, "count")
    resumed = plan_slots(store, group=GROUP, resume=True)
    assert [(r.start, r.stop) for r in resumed.ranges] == [(0, 12), (12, 24), (24, 36), (36, EXTENT)]
    for r in resumed.ranges:
        with SlotWriter(store, r.start, r.stop, group=GROUP, write_behind=depth) as writer:
            write_span(writer, r.start, r.stop)
    assert array_bytes(store) == reference
    assert write_status(store, GROUP).completed == ((0, EXTENT),)


# -- a second coordinator -------------------------------------------------------------
def test_a_second_create_layout_with_another_spec_refuses_and_changes_nothing(
    store: Store, reference: dict[str, bytes]
) -> None:
    with SlotWriter(store, 0, EXTENT, group=GROUP) as writer:
        write_span(writer, 0, BATCH)
        before = array_bytes(store)
        with pytest.raises(LayoutMismatchError, match=r"count: chunks is \(4,\) in the store but \(8,\)") as info:
            create_layout(store, respec("count", chunks=(8,)), group=GROUP)
        assert isinstance(info.value, LayoutMismatchError) and not isinstance(info.value, LayoutChangedError)
        assert array_bytes(store) == before  # refused before touching anything
        write_span(writer, BATCH, EXTENT)  # the writer never noticed: nothing changed
    assert array_bytes(store) == reference


# -- worker processes -----------------------------------------------------------------


def _change_under_workers(store: Store, tmp_path: Path, change: str, depth: int, reference: dict[str, bytes]) -> None:
    create_layout(store, layout_spec(), group=GROUP)
    plan = plan_slots(store, group=GROUP, workers=2)
    opened, go = SPAWN.Barrier(len(plan.ranges) + 1), SPAWN.Event()
    reports = [tmp_path / f"report-{r.start}" for r in plan.ranges]
    procs = [
        SPAWN.Process(target=paused_worker, args=(store, r.start, r.stop, depth, opened, go, str(report)))
        for r, report in zip(plan.ranges, reports)
    ]
    for p in procs:
        p.start()
    opened.wait(WORKER_TIMEOUT_S)  # every worker holds its claim and wrote its first batch
    make, fix = CHANGES[change]
    make(store)
    go.set()
    assert join_all(procs) == [EXIT_CHANGED] * len(procs)
    array = "count" if change == "rechunk" else "pred"
    for r, report in zip(plan.ranges, reports):
        kinds, message = report.read_text().split("\n", 1)
        assert kinds == ("WriteBehindError" if depth else "LayoutChangedError") + ":LayoutChangedError"
        assert f"slot [{r.start}, {r.stop})" in message and f"\n  {array}: " in message
    _nothing_recorded(store)

    fix(store)  # the coordinator restores the run's layout
    resumed = plan_slots(store, group=GROUP, resume=True, workers=2)
    assert resumed.ranges == plan.ranges  # every refused slot is planned again
    for r in resumed.ranges:
        with SlotWriter(store, r.start, r.stop, group=GROUP) as writer:
            write_span(writer, r.start, r.stop)
    assert array_bytes(store) == reference
    assert write_status(store, GROUP).completed == ((0, EXTENT),)


@pytest.mark.slow
@pytest.mark.parametrize(("change", "depth"), [("rechunk", 0), ("resize", 2)])
def test_workers_on_a_local_store_refuse_a_change_and_resume_after_the_fix(
    tmp_path: Path, reference: dict[str, bytes], change: str, depth: int
) -> None:
    _change_under_workers(LocalStore(tmp_path / "out.zarr"), tmp_path, change, depth, reference)


@pytest.mark.slow
def test_workers_on_s3_refuse_a_change_and_resume_after_the_fix(
    write_s3_store: Store, tmp_path: Path, reference: dict[str, bytes]
) -> None:
    _change_under_workers(write_s3_store, tmp_path, "rechunk", 2, reference)
