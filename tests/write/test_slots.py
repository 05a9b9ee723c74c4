"""plan_slots: LCM alignment, shard-sharing rejection, resume, blocked gaps, JSON and scheduler env."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from write_helpers import ALIGNMENT, EXTENT, GROUP, layout_spec
from zarr.storage import MemoryStore

from insitubatch.errors import LayoutMismatchError, SlotAlignmentError, SlotPlanBlockedError
from insitubatch.write import (
    LayoutSpec,
    OutputArray,
    SlotPlan,
    SlotRange,
    SlotWriter,
    assigned_ranges,
    clear_coverage,
    create_layout,
    plan_slots,
    task_index_from_env,
)
from insitubatch.write.records import RecordStore


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    return store


def _complete(store: MemoryStore, start: int, stop: int, **options: object) -> None:
    with SlotWriter(store, start, stop, group=GROUP, **options):
        pass


def _pairs(ranges: tuple[SlotRange, ...]) -> list[tuple[int, int]]:
    return [(r.start, r.stop) for r in ranges]


def test_default_plan_is_one_range_per_alignment_unit(store: MemoryStore) -> None:
    plan = plan_slots(store, group=GROUP)
    assert plan.alignment == ALIGNMENT and plan.extent == EXTENT and plan.slot_size == ALIGNMENT
    # the final range ends at the array end, inside a partial chunk and shard
    assert _pairs(plan.ranges) == [(0, 12), (12, 24), (24, 36), (36, 44)]
    assert plan.indexed == {"count": 0, "pred": 0}


def test_workers_split_units_evenly(store: MemoryStore) -> None:
    assert _pairs(plan_slots(store, group=GROUP, workers=2).ranges) == [(0, 24), (24, 44)]
    assert _pairs(plan_slots(store, group=GROUP, workers=3).ranges) == [(0, 24), (24, 36), (36, 44)]
    assert len(plan_slots(store, group=GROUP, workers=10).ranges) == 4  # never finer than one unit


def test_explicit_slot_size_must_be_a_multiple_of_the_lcm(store: MemoryStore) -> None:
    assert _pairs(plan_slots(store, group=GROUP, slot_size=24).ranges) == [(0, 24), (24, 44)]
    with pytest.raises(SlotAlignmentError, match=r"multiple of 12.*pred: chunk 2, shard 6") as info:
        plan_slots(store, group=GROUP, slot_size=18)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match="not both"):
        plan_slots(store, group=GROUP, slot_size=12, workers=2)
    with pytest.raises(ValueError, match="workers=0"):
        plan_slots(store, group=GROUP, workers=0)


@pytest.mark.invariant
def test_shard_sharing_ranges_are_rejected_by_the_planner() -> None:
    """Ranges aligned to the inner chunk (2) but not the shard (6) would share shard objects."""
    store = MemoryStore()
    spec = LayoutSpec((OutputArray("pred", (24, 4), (2, 4), "f4", shards=(6, 4)),))
    create_layout(store, spec)
    with pytest.raises(SlotAlignmentError, match="multiple of 6"):
        plan_slots(store, slot_size=2)
    with pytest.raises(SlotAlignmentError, match="multiple of 6"):
        plan_slots(store, slot_size=4)
    assert _pairs(plan_slots(store).ranges) == [(0, 6), (6, 12), (12, 18), (18, 24)]


def test_resume_excludes_completed_and_live_ranges(store: MemoryStore) -> None:
    _complete(store, 12, 24)
    plan = plan_slots(store, group=GROUP)
    assert _pairs(plan.ranges) == [(0, 12), (24, 36), (36, 44)]
    assert _pairs(plan.completed) == [(12, 24)]
    with SlotWriter(store, 36, 44, group=GROUP):
        during = plan_slots(store, group=GROUP)
    assert _pairs(during.ranges) == [(0, 12), (24, 36)] and _pairs(during.in_progress) == [(36, 44)]
    assert len(plan_slots(store, group=GROUP, resume=False).ranges) == 4
    _complete(store, 0, 12)
    _complete(store, 24, 36)  # [36, 44) was completed by the `with` above
    assert plan_slots(store, group=GROUP).ranges == ()


def test_workers_partition_only_what_remains(store: MemoryStore) -> None:
    _complete(store, 12, 24)
    plan = plan_slots(store, group=GROUP, workers=2)
    # 3 units left in two gaps: runs of 2 and 1 units; the first run spans the hole
    assert _pairs(plan.ranges) == [(0, 12), (24, 36), (36, 44)]
    _complete(store, 0, 12)
    assert _pairs(plan_slots(store, group=GROUP, workers=2).ranges) == [(24, 36), (36, 44)]


def test_unalignable_gap_is_reported_and_planning_refuses(store: MemoryStore) -> None:
    with pytest.raises(SlotAlignmentError, match=r"Nearest aligned range containing it: \[0, 12\)"):
        _complete(store, 0, 6, force=True)  # writers never record misaligned coverage, even forced
    # ...but a record written by other means (a hand edit, another tool) can be misaligned
    record = {"start": 0, "stop": 6, "worker_id": "legacy", "host": "h", "pid": 1, "completed_at": 0.0, "token": "t"}
    RecordStore(store, GROUP, "coverage").create("legacy", record)
    with pytest.raises(SlotPlanBlockedError, match=r"\[6, 12\).*clear_coverage") as info:
        plan_slots(store, group=GROUP)
    assert info.value.blocked == ((6, 12),)
    assert "--clear-coverage" in str(info.value)
    clear_coverage(store, 0, 12, group=GROUP)
    assert _pairs(plan_slots(store, group=GROUP).ranges)[0] == (0, 12)


def test_plan_json_round_trip_and_env(store: MemoryStore) -> None:
    plan = plan_slots(store, group=GROUP, workers=2, store_url="s3://bucket/run.zarr")
    doc = json.loads(plan.to_json())
    assert doc["tasks"] == 2 and doc["slurm_array"] == "0-1"
    assert doc["task_index_variables"] == ["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX", "RANK"]
    assert doc["ranges"][1]["env"] == {
        "INSITUBATCH_SLOT_START": "24",
        "INSITUBATCH_SLOT_STOP": "44",
        "INSITUBATCH_SLOT_GROUP": GROUP,
        "INSITUBATCH_STORE": "s3://bucket/run.zarr",
    }
    assert SlotPlan.from_json(plan.to_json()) == plan


def test_plan_save_load(store: MemoryStore, tmp_path) -> None:
    plan = plan_slots(store, group=GROUP)
    plan.save(tmp_path / "plan.json")
    assert SlotPlan.load(tmp_path / "plan.json") == plan
    with pytest.raises(ValueError, match="version"):
        SlotPlan.from_dict({**plan.to_dict(), "version": 99})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4, "SLURM_ARRAY_TASK_ID")),
        ({"JOB_COMPLETION_INDEX": "1"}, (1, None, "JOB_COMPLETION_INDEX")),
        ({"RANK": "3", "WORLD_SIZE": "8"}, (3, 8, "RANK")),
        ({"SLURM_ARRAY_TASK_ID": "0", "RANK": "5"}, (0, None, "SLURM_ARRAY_TASK_ID")),
    ],
)
def test_task_index_from_scheduler_env(env: dict[str, str], expected: tuple) -> None:
    assert task_index_from_env(env) == expected


def test_task_index_errors() -> None:
    with pytest.raises(KeyError, match="SLURM_ARRAY_TASK_ID"):
        task_index_from_env({})
    with pytest.raises(ValueError, match="RANK"):
        task_index_from_env({"RANK": "x"})


def test_assigned_ranges_from_env(store: MemoryStore, tmp_path) -> None:
    plan = plan_slots(store, group=GROUP)  # 4 ranges
    plan.save(tmp_path / "plan.json")
    direct = {"INSITUBATCH_SLOT_START": "12", "INSITUBATCH_SLOT_STOP": "24", "INSITUBATCH_SLOT_GROUP": GROUP}
    assert assigned_ranges(env=direct) == ((SlotRange(12, 24),), GROUP)
    by_file = {"INSITUBATCH_SLOT_PLAN": str(tmp_path / "plan.json"), "JOB_COMPLETION_INDEX": "3"}
    assert assigned_ranges(env=by_file) == ((SlotRange(36, 44),), GROUP)
    # torchrun with fewer ranks than ranges: rank r writes ranges r, r + world, ...
    assert assigned_ranges(plan, {"RANK": "1", "WORLD_SIZE": "3"})[0] == (SlotRange(12, 24),)
    assert assigned_ranges(plan, {"RANK": "0", "WORLD_SIZE": "3"})[0] == (SlotRange(0, 12), SlotRange(36, 44))
    assert assigned_ranges(plan, {"RANK": "5", "WORLD_SIZE": "6"})[0] == ()  # more ranks than ranges
    with pytest.raises(IndexError, match="--array=0-3"):
        assigned_ranges(plan, {"SLURM_ARRAY_TASK_ID": "4"})
    with pytest.raises(KeyError, match="INSITUBATCH_SLOT_PLAN"):
        assigned_ranges(env={"RANK": "0"})
    with pytest.raises(KeyError, match="both"):
        assigned_ranges(env={"INSITUBATCH_SLOT_START": "0"})


def test_plan_without_layout_says_how_to_make_one() -> None:
    with pytest.raises(LayoutMismatchError, match="create_layout"):
        plan_slots(MemoryStore(), group="nothing")


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[LayoutSpec, list[int]]:
    arrays = []
    extent = draw(st.integers(1, 120))
    for i in range(draw(st.integers(1, 3))):
        chunk = draw(st.integers(1, 7))
        shards = draw(st.one_of(st.none(), st.integers(1, 4)))
        arrays.append(
            OutputArray(
                f"a{i}",
                (extent, 2),
                (chunk, 2),
                "i2",
                shards=None if shards is None else (chunk * shards, 2),
            )
        )
    done_units = draw(st.lists(st.integers(0, 200), max_size=6))
    return LayoutSpec(tuple(arrays)), done_units


@pytest.mark.invariant
@settings(max_examples=40, deadline=None)
@given(_layouts(), st.one_of(st.none(), st.integers(1, 5)))
def test_plan_invariants(layout_and_done: tuple[LayoutSpec, list[int]], workers: int | None) -> None:
    """Ranges are disjoint, aligned, inside the extent, and cover exactly what is not complete."""
    spec, done_units = layout_and_done
    store = MemoryStore()
    create_layout(store, spec)
    alignment = math.lcm(*(n for a in spec.arrays for n in (a.chunks[0], (a.shards or a.chunks)[0])))
    units = math.ceil(spec.extent / alignment)
    done = sorted({u % units for u in done_units})
    for u in done:
        _complete_root(store, u * alignment, min((u + 1) * alignment, spec.extent))
    plan = plan_slots(store, workers=workers)
    assert plan.alignment == alignment
    if workers is not None:
        remaining_units = units - len(done)
        assert len(plan.ranges) >= min(workers, remaining_units)
        assert len(plan.ranges) <= min(workers, remaining_units) + len(done)  # holes add ranges
    covered: list[int] = []
    for r in plan.ranges:
        assert 0 <= r.start < r.stop <= spec.extent
        assert r.start % alignment == 0 and (r.stop % alignment == 0 or r.stop == spec.extent)
        assert r.size <= plan.slot_size
        covered.extend(range(r.start, r.stop))
    assert len(covered) == len(set(covered))  # disjoint
    expected = {i for i in range(spec.extent) if i // alignment not in done}
    assert set(covered) == expected


def _complete_root(store: MemoryStore, start: int, stop: int) -> None:
    with SlotWriter(store, start, stop):
        pass
