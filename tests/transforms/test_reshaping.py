"""Chunk transforms that drop, add or reorder inner axes, through every path of the engine.

Each transform is checked against numpy applied to zarr-python's own read of
the same samples: local v2/v3 arrays, sharded ones, several tiles per stored
chunk, over the HTTP emulator, under a selection, a shift and a window,
through the persisted cache, torch and JAX, and a resumed pass.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataset, applies, as_torch, open_geometries, split_by_chunk, to_jax
from insitubatch.errors import StaleCacheError
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.tools.check_transform import main as check_transform

N, LAT, LON = 22, 6, 8  # 22 samples in chunks of 4: the last chunk holds 2
X = np.random.default_rng(37).random((N, LAT, LON), dtype="f4")
# each layout is written by zarr-python; "tiles" splits the field 2x2, clipped at its far edges
LAYOUTS = {
    "v2": {"zarr_format": 2, "chunks": (4, LAT, LON)},
    "v3": {"chunks": (4, LAT, LON)},
    "sharded": {"shards": (8, LAT, LON), "chunks": (4, LAT, LON)},
    "sharded-tiles": {"shards": (8, LAT, LON), "chunks": (4, 3, LON)},
    "tiles": {"chunks": (4, 4, 5)},
}


class MeanLon:
    """Drops an axis: ``(n, lat, lon) -> (n, lat)``."""

    cache_key = "test/mean-lon/v1"

    def output_inner(self, g):
        return g.inner_shape[:-1], g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.mean(axis=-1, dtype=chunk.data.dtype))

    @staticmethod
    def ref(rows: np.ndarray) -> np.ndarray:
        return rows.mean(axis=-1, dtype=rows.dtype)


class StackSquare:
    """Adds an axis: ``(n, lat, lon) -> (n, 2, lat, lon)``, the field and its square."""

    cache_key = "test/stack-square/v1"

    def output_inner(self, g):
        return (2, *g.inner_shape), g.dtype

    def __call__(self, chunk):
        d = chunk.data
        return dataclasses.replace(chunk, data=np.stack([d, d * d], axis=1))

    @staticmethod
    def ref(rows: np.ndarray) -> np.ndarray:
        return np.stack([rows, rows * rows], axis=1)


class AddChannel:
    """Adds an axis of 1: ``(n, lat, lon) -> (n, 1, lat, lon)``, a view of the decoded chunk."""

    cache_key = "test/add-channel/v1"

    def output_inner(self, g):
        return (1, *g.inner_shape), g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data[:, None])

    @staticmethod
    def ref(rows: np.ndarray) -> np.ndarray:
        return rows[:, None]


class SwapFieldAxes:
    """Reorders axes: ``(n, lat, lon) -> (n, lon, lat)``, returned as a strided view."""

    cache_key = "test/swap-field-axes/v1"

    def output_inner(self, g):
        return g.inner_shape[::-1], g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.swapaxes(1, 2))

    @staticmethod
    def ref(rows: np.ndarray) -> np.ndarray:
        return rows.swapaxes(1, 2)


RESHAPES = [MeanLon, StackSquare, SwapFieldAxes]
IDS = ["drop", "add", "reorder"]
# where a case costs a dataset, each reshape once: on chunks of one tile (v3) or assembled from several (tiles)
ON_LAYOUTS = pytest.mark.parametrize(
    ("layout", "transform"), [("v3", MeanLon), ("tiles", StackSquare), ("tiles", SwapFieldAxes)], ids=IDS
)


def _write(folder: Path, layout: str) -> Path:
    """``x`` (transformed below) and ``y = x + 1`` (read as stored) in ``layout``; returns the store's path."""
    kw = dict(LAYOUTS[layout])
    root = zarr.open_group(folder / f"{layout}.zarr", mode="w", zarr_format=kw.pop("zarr_format", 3))
    root.create_array("x", shape=X.shape, dtype=X.dtype, **kw)[...] = X
    root.create_array("y", shape=X.shape, dtype=X.dtype, **kw)[...] = X + 1
    return folder / f"{layout}.zarr"


def _oracle(path: Path, name: str = "x") -> np.ndarray:
    return zarr.open_array(str(path / name), mode="r")[...]


def _open(store, transform, views=lambda g: {"x": g}, **kw) -> InSituDataset:
    geoms = open_geometries(store, variables=["x", "y"])
    kw.setdefault("batch_size", 5)
    return InSituDataset(
        store,
        split_by_chunk(geoms["x"], fractions=(1.0,)),
        views(geoms["x"]),
        chunk_transforms=[applies(["x"], transform)],
        **kw,
    )


def _expected(ref, field: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``ref`` over the rows ``idx`` (``(batch,)`` or a window's ``(batch, steps)``) of ``field``."""
    rows = ref(field[idx.reshape(-1)])
    return rows.reshape(*idx.shape, *rows.shape[1:])


def _check(batches, ref, fields: dict[str, np.ndarray], geometries) -> int:
    """Every label of every batch equals ``ref`` (identity for ``y``) of its oracle rows; returns the samples seen."""
    seen = 0
    for batch in batches:
        for label, field in fields.items():
            got = batch.arrays[label]
            want = _expected(ref if label != "y" else (lambda r: r), field, batch.read_indices(label))
            assert got.shape == (len(batch), *geometries[label].row_shape) and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"label {label!r} of batch {batch.index}")
        seen += len(batch)
    return seen


@pytest.mark.parametrize(
    ("layout", "transform"),
    [*((layout, t) for layout in LAYOUTS for t in RESHAPES), ("tiles", AddChannel)],
    ids=[*(f"{layout}-{i}" for layout in LAYOUTS for i in IDS), "tiles-channel"],
)
def test_local_arrays_of_every_layout(tmp_path, layout, transform) -> None:
    path = _write(tmp_path, layout)
    x = _oracle(path)
    geoms = open_geometries(str(path))
    declared = transform().output_inner(geoms["x"])[0]
    # y has no transform: its tiles take the grouped local decode in the same pass
    with _open(str(path), transform(), lambda g: {"x": g, "y": geoms["y"]}) as ds:
        assert ds.geometries["x"].inner_shape == declared and ds.geometries["y"].inner_shape == (LAT, LON)
        assert _check(ds.train, transform.ref, {"x": x, "y": x + 1}, ds.geometries) == N


@pytest.mark.parametrize(
    ("layout", "transform"), [("v3", MeanLon), ("sharded-tiles", StackSquare), ("sharded", SwapFieldAxes)], ids=IDS
)
def test_over_the_emulator(emulator, layout, transform) -> None:
    path = _write(emulator.root, layout)
    store = obstore_store(emulator.url_for(path.name), read_only=True)
    with _open(store, transform(), lambda g: {"x": g, "next": g.shift(1)}) as ds:
        assert _check(ds.train, transform.ref, {"x": _oracle(path), "next": _oracle(path)}, ds.geometries) == N - 1
    assert emulator.stats().gets_where(lambda key: "/x/" in key) > 0


# a selection applies to the stored array before the transform: the transform gets the selected block
SELECTIONS = {
    "v3-lat-slice": ("v3", {1: slice(1, 5)}),
    "tiles-lon-reversed": ("tiles", {2: slice(None, None, -2)}),  # cut from both field tiles, then assembled
}


@pytest.mark.parametrize("transform", RESHAPES, ids=IDS)
@pytest.mark.parametrize("selection", list(SELECTIONS))
def test_a_selection_is_made_before_the_transform(tmp_path, selection, transform) -> None:
    layout, picked = SELECTIONS[selection]
    path = _write(tmp_path, layout)
    x = _oracle(path)[(slice(None), *(picked.get(axis, slice(None)) for axis in (1, 2)))]
    with _open(str(path), transform(), lambda g: {"x": g.isel(picked)}) as ds:
        assert ds.geometries["x"].inner_shape == transform.ref(x[:1]).shape[1:]
        assert _check(ds.train, transform.ref, {"x": x}, ds.geometries) == N


def test_a_selection_that_drops_an_axis_then_a_mean_leaves_one_value_per_sample(tmp_path) -> None:
    path = _write(tmp_path, "tiles")
    with _open(str(path), MeanLon(), lambda g: {"x": g.isel({1: 4})}) as ds:
        assert ds.geometries["x"].inner_shape == ()
        assert _check(ds.train, MeanLon.ref, {"x": _oracle(path)[:, 4]}, ds.geometries) == N


@ON_LAYOUTS
def test_shifts_and_windows_stack_transformed_rows(tmp_path, layout, transform) -> None:
    path = _write(tmp_path, layout)
    x = _oracle(path)
    views = lambda g: {"x": g, "ahead": g.shift(2), "steps": g.window([-1, 0])}  # noqa: E731
    with _open(str(path), transform(), views) as ds:
        out = transform.ref(x[:1]).shape[1:]
        assert ds.geometries["steps"].row_shape == (2, *out) and ds.geometries["ahead"].inner_shape == out
        assert _check(ds.train, transform.ref, dict.fromkeys(["x", "ahead", "steps"], x), ds.geometries) == N - 3


def _epoch(ds) -> tuple[list[list[int]], list[np.ndarray], object]:
    it = iter(ds.train)
    idx, arrays = [], []
    for batch in it:
        idx.append(batch.sample_indices.tolist())
        arrays.append(batch.arrays["x"].copy())
    return idx, arrays, it.counters


@ON_LAYOUTS
def test_the_persisted_cache_revives_transformed_chunks_without_gets(tmp_path, layout, transform) -> None:
    path = _write(tmp_path, layout)
    cached = {"cache_dir": str(tmp_path / "cache"), "persist": True, "seed": 3}
    with _open(str(path), transform(), **cached) as cold:
        idx, arrays, counters = _epoch(cold)
        assert counters.gets > 0
    with _open(str(path), transform(), **cached) as warm:
        warm_idx, warm_arrays, counters = _epoch(warm)
        assert counters.gets == 0 and counters.revived == -(-N // 4)  # every chunk from its tile file
    assert warm_idx == idx
    x = _oracle(path)
    for rows, a, b in zip(idx, arrays, warm_arrays):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(b, transform.ref(x[rows]), rtol=1e-6)


class MeanLat(MeanLon):
    """``MeanLon``'s cache_key, but the mean over the other axis: a changed ``output_inner``."""

    def output_inner(self, g):
        return g.inner_shape[1:], g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.mean(axis=1, dtype=chunk.data.dtype))


class MeanLatKeyed(MeanLat):
    cache_key = "test/mean-lat/v1"


def test_a_changed_output_inner_is_a_miss_or_a_stale_error_never_old_data(tmp_path) -> None:
    path = _write(tmp_path, "tiles")
    cached = {"cache_dir": str(tmp_path / "cache"), "persist": True}
    with _open(str(path), MeanLon(), **cached) as ds:
        _epoch(ds)
    # the same cache_key but another inner shape: the tile files do not fit, every chunk is fetched again
    with _open(str(path), MeanLat(), **cached) as ds:
        idx, arrays, counters = _epoch(ds)
        assert counters.revived == 0 and counters.gets > 0
    x = _oracle(path)
    for rows, got in zip(idx, arrays):
        np.testing.assert_allclose(got, x[rows].mean(axis=1, dtype=x.dtype), rtol=1e-6)
    # another cache_key: the cache names the change
    with pytest.raises(StaleCacheError, match="chunk transforms changed"):
        _open(str(path), MeanLatKeyed(), **cached)


@ON_LAYOUTS
def test_torch_and_jax_carry_the_transformed_shape(tmp_path, layout, transform) -> None:
    torch = pytest.importorskip("torch")  # CI leg 2 (Python 3.13) installs no torch
    pytest.importorskip("jax")
    path = _write(tmp_path, layout)
    x = _oracle(path)
    with _open(str(path), transform(), lambda g: {"x": g, "steps": g.window([-1, 0])}) as ds:
        order = [b.sample_indices for b in ds.train]  # the same epoch: the same batches
        for rows, tensors, arrays in zip(order, as_torch(ds.train), to_jax(ds.train), strict=True):
            for label, got in (("x", tensors["x"]), ("steps", tensors["steps"])):
                steps = rows[:, None] + np.asarray([-1, 0]) if label == "steps" else rows
                assert isinstance(got, torch.Tensor)
                assert tuple(got.shape) == tuple(arrays[label].shape) == (len(rows), *ds.geometries[label].row_shape)
                np.testing.assert_allclose(got.numpy(), _expected(transform.ref, x, steps), rtol=1e-6)
                np.testing.assert_array_equal(np.asarray(arrays[label]), got.numpy())


@ON_LAYOUTS
def test_a_resumed_pass_yields_the_transformed_tail(tmp_path, layout, transform) -> None:
    path = _write(tmp_path, layout)
    x = _oracle(path)
    opts = {"batch_size": 3, "block_chunks": 2, "seed": 5}
    with _open(str(path), transform(), **opts) as first:
        full = [b.sample_indices.tolist() for b in first.train]
        it = iter(first.train)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(first.train.state_dict()))
        it.close()
    with _open(str(path), transform(), **opts) as second:
        second.train.load_state_dict(state)
        tail = list(second.train)
        assert [b.sample_indices.tolist() for b in tail] == full[3:]
        assert _check(tail, transform.ref, {"x": x}, second.geometries) == N - 3 * 3


class DeclaresLatKeepsLon:
    """Declares ``(lat,)`` but returns ``(n, lon)``: a rank-dropping transform whose declaration is wrong."""

    def output_inner(self, g):
        return g.inner_shape[:-1], g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.mean(axis=1))


def test_an_output_unlike_its_declaration_names_transform_array_chunk_and_shapes(tmp_path) -> None:
    path = _write(tmp_path, "v3")
    with _open(str(path), DeclaresLatKeepsLon()) as ds:
        with pytest.raises(
            ValueError,
            match=r"DeclaresLatKeepsLon turned 'x' chunk \d+ from \((4|2), 6, 8\) into \(\1, 8\) float32, "
            r"but its output_inner declares inner \(6,\) float32",
        ):
            list(ds.train)


def test_an_output_inner_that_returns_no_shape_fails_when_the_dataset_is_built(tmp_path) -> None:
    path = _write(tmp_path, "v3")

    class NoShape(MeanLon):
        def output_inner(self, g):
            return "lat"

    with pytest.raises(TypeError, match=r"NoShape.output_inner\(geometry\) for array 'x' must return"):
        _open(str(path), NoShape())


PREP = """
import dataclasses

class MeanLon:
    def output_inner(self, g):
        return g.inner_shape[:-1], g.dtype

    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.mean(axis=-1))

class StackSquare:
    def output_inner(self, g):
        return (2, *g.inner_shape), g.dtype

    def __call__(self, chunk):
        d = chunk.data
        return dataclasses.replace(chunk, data=__import__("numpy").stack([d, d * d], axis=1))

class DeclaresLatKeepsLon(MeanLon):
    def __call__(self, chunk):
        return dataclasses.replace(chunk, data=chunk.data.mean(axis=1))
"""


@pytest.mark.parametrize(
    ("attr", "code", "line"),
    [
        ("MeanLon", 0, "PASS output-inner declared (6,) float32 matches the output"),
        ("StackSquare", 0, "PASS output-inner declared (2, 6, 8) float32 matches the output"),
        (
            "DeclaresLatKeepsLon",
            1,
            "DeclaresLatKeepsLon.output_inner declares inner (6,) float32 but the transform returned (8,) float32",
        ),
    ],
)
def test_check_transform_compares_a_changed_rank(tmp_path, capsys, attr, code, line) -> None:
    path = _write(tmp_path, "tiles")
    (tmp_path / "prep.py").write_text(PREP)
    got = check_transform([str(path), "--var", "x", "--transform", f"{tmp_path / 'prep.py'}:{attr}", "--no-gil-probe"])
    out = capsys.readouterr().out
    assert got == code, out
    assert line in out
