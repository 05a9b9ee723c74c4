"""create_layout / diff_layout / read_layout: full fixed extent, idempotence, readable diffs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import zarr
from write_helpers import ALIGNMENT, EXTENT, GROUP, layout_spec, store_bytes
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.storage import LocalStore, MemoryStore

from insitubatch.errors import LayoutMismatchError
from insitubatch.write import LayoutSpec, OutputArray, create_layout, diff_layout, read_layout


def _with(spec: LayoutSpec, name: str, **changes: object) -> LayoutSpec:
    return LayoutSpec(tuple(dataclasses.replace(a, **changes) if a.name == name else a for a in spec.arrays))


def test_creates_every_array_at_full_extent(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "o.zarr")
    group = create_layout(store, layout_spec(), group=GROUP)
    pred, count, x = group["pred"], group["count"], group["x"]
    assert pred.shape == (EXTENT, 3, 8) and pred.chunks == (2, 3, 8) and pred.shards == (6, 3, 8)
    assert count.shape == (EXTENT,) and x.shape == (8,)
    assert np.isnan(pred[:]).all()  # preallocated, nothing written yet
    assert pred.metadata.dimension_names == ("time", "channel", "x")


def test_rerun_with_same_spec_writes_nothing() -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    before = store_bytes(store)
    create_layout(store, layout_spec(), group=GROUP)
    assert store_bytes(store) == before
    assert diff_layout(store, layout_spec(), group=GROUP) == ()


def test_missing_arrays_are_added_existing_ones_kept() -> None:
    store = MemoryStore()
    spec = layout_spec()
    create_layout(store, LayoutSpec(spec.arrays[:1]), group=GROUP)
    with pytest.raises(LayoutMismatchError, match="layout record: indexed"):
        create_layout(store, spec, group=GROUP)  # the indexed set is part of the layout record


@pytest.mark.parametrize(
    ("changes", "fact"),
    [
        ({"shape": (EXTENT, 3, 9)}, "shape"),
        ({"dtype": "float64"}, "dtype"),
        ({"chunks": (3, 3, 8), "shards": (6, 3, 8)}, "chunks"),
        ({"shards": (12, 3, 8)}, "shards"),
        ({"shards": None}, "shards"),
        ({"compressors": BloscCodec(cname="lz4")}, "codecs"),
        ({"fill_value": 0.0}, "fill_value"),
        ({"dimension_names": ("t", "c", "x")}, "dimension_names"),
    ],
)
def test_different_spec_raises_a_readable_diff(changes: dict[str, object], fact: str) -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    before = store_bytes(store)
    changed = _with(layout_spec(), "pred", **changes)
    with pytest.raises(LayoutMismatchError) as info:
        create_layout(store, changed, group=GROUP)
    assert any(line.startswith(f"pred: {fact} is ") and "in the store but" in line for line in info.value.diff)
    assert f"pred: {fact} is" in str(info.value)
    assert store_bytes(store) == before  # a mismatch creates nothing
    assert diff_layout(store, changed, group=GROUP) == info.value.diff


def test_mismatch_is_detected_before_creating_missing_arrays() -> None:
    store = MemoryStore()
    spec = layout_spec()
    create_layout(store, LayoutSpec(spec.arrays[:1] + spec.arrays[2:]), group="g2")
    grown = _with(spec, "pred", dtype="float16")
    with pytest.raises(LayoutMismatchError):
        create_layout(store, grown, group="g2")
    assert "count" not in zarr.open_group(store, path="g2", mode="r")


def test_explicit_codecs_round_trip(tmp_path: Path) -> None:
    spec = _with(layout_spec(), "count", compressors=ZstdCodec(level=3))
    store = LocalStore(tmp_path / "o.zarr")
    create_layout(store, spec, group=GROUP)
    create_layout(store, spec, group=GROUP)
    assert diff_layout(store, _with(spec, "count", compressors=ZstdCodec(level=5)), group=GROUP)


def test_read_layout_recomputes_alignment_from_the_arrays() -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    layout = read_layout(store, GROUP)
    assert layout.extent == EXTENT and layout.names == ["count", "pred"]
    assert layout.alignment == ALIGNMENT == math.lcm(2, 6, 4)
    assert layout.array("pred").shard == 6 and layout.array("count").shard is None


def test_read_layout_of_a_plain_group_says_how_to_make_one() -> None:
    store = MemoryStore()
    zarr.open_group(store, path="plain", mode="w")
    with pytest.raises(LayoutMismatchError, match="create_layout"):
        read_layout(store, "plain")
    with pytest.raises(LayoutMismatchError, match="does not exist"):
        read_layout(store, "nowhere")


def test_v2_group_is_refused() -> None:
    store = MemoryStore()
    zarr.open_group(store, path="old", mode="w", zarr_format=2)
    with pytest.raises(LayoutMismatchError, match="zarr v3"):
        create_layout(store, layout_spec(), group="old")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "a/b"}, "name="),
        ({"name": ".insitubatch"}, "reserved"),
        ({"chunks": (2, 3)}, "one entry per axis"),
        ({"shards": (5, 3, 8)}, "multiple of"),
        ({"index_axis": 3}, "index_axis=3"),
        ({"shape": (-1, 3, 8)}, "integers >= 0"),
        ({"dimension_names": ("t",)}, "dimension_names"),
    ],
)
def test_array_spec_validation_names_the_parameter(kwargs: dict[str, object], message: str) -> None:
    base = {"name": "a", "shape": (10, 3, 8), "chunks": (2, 3, 8), "dtype": "f4", "shards": (6, 3, 8)}
    with pytest.raises(ValueError, match=message):
        OutputArray(**{**base, **kwargs})


def test_layout_spec_requires_one_shared_indexed_extent() -> None:
    a = OutputArray("a", (10,), (2,), "f4")
    with pytest.raises(ValueError, match="share one extent"):
        LayoutSpec((a, OutputArray("b", (12,), (2,), "f4")))
    with pytest.raises(ValueError, match="at least one array must be indexed"):
        LayoutSpec((OutputArray("c", (10,), (2,), "f4", index_axis=None),))
    with pytest.raises(ValueError, match="unique"):
        LayoutSpec((a, a))
    spec = LayoutSpec((a, OutputArray("b", (4, 10), (4, 5), "f4", index_axis=-1)))
    assert spec.indexed == {"a": 0, "b": 1} and spec.extent == 10


def test_record_groups_keep_the_hierarchy_valid(tmp_path: Path) -> None:
    """Claims and coverage are zarr groups: listing members recursively raises no warning."""
    from insitubatch.write import SlotWriter

    store = LocalStore(tmp_path / "o.zarr")
    create_layout(store, layout_spec(), group=GROUP)
    with SlotWriter(store, 0, ALIGNMENT, group=GROUP):
        names = {name for name, _ in zarr.open_group(store, path=GROUP, mode="r").members(max_depth=None)}
    assert {"pred", "count", "x", ".insitubatch/claims", ".insitubatch/coverage"} <= names
    after = {name for name, _ in zarr.open_group(store, path=GROUP, mode="r").members(max_depth=None)}
    assert not any(n.startswith(".insitubatch/claims/") for n in after)  # released claim left no directory
    assert any(n.startswith(".insitubatch/coverage/") for n in after)


def test_public_names_are_sorted_and_importable() -> None:
    import insitubatch.write as write

    assert write.__all__ == sorted(write.__all__)
    assert all(hasattr(write, name) for name in write.__all__)


def test_spec_zarr_cannot_create_is_a_value_error() -> None:
    store = MemoryStore()
    create_layout(store, layout_spec(), group=GROUP)
    with pytest.raises(ValueError, match="count: zarr cannot create"):
        diff_layout(store, _with(layout_spec(), "count", fill_value=float("nan")), group=GROUP)
        diff_layout(store, _with(layout_spec(), "count", fill_value=float("nan")), group=GROUP)


def test_the_old_arrayspec_name_still_imports_with_a_deprecation_warning() -> None:
    import insitubatch.write

    with pytest.warns(DeprecationWarning, match="use insitubatch.write.OutputArray"):
        from insitubatch.write import ArraySpec
    assert ArraySpec is OutputArray
    assert "ArraySpec" not in insitubatch.write.__all__
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        insitubatch.write.NoSuchName  # noqa: B018
