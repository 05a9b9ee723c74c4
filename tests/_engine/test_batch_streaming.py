"""Whether a batch is written past the caches is decided on the whole batch, every array of it, not array by array.

The consumer reads a batch after its last array is gathered: four arrays of
8 MB each (ERA5-like fields at batch 32) are a 33 MB batch that no cache
keeps, though no one array's copy reaches the threshold on its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import smooth_field

import insitubatch._engine.passes.gather as batch_gather
from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk

SHAPE = (24, 10, 12)
CHUNKS = (4, 5, 6)
BATCH = 6
ARRAYS = ("a", "b", "c")


@pytest.fixture
def three_arrays(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    root = zarr.open_group(tmp_path / "g.zarr", mode="w")
    data = {}
    for k, name in enumerate(ARRAYS):
        data[name] = smooth_field(np.random.default_rng(k), SHAPE)
        root.create_array(name, shape=SHAPE, chunks=CHUNKS, dtype="f4")[...] = data[name]
    return tmp_path / "g.zarr", data


def _gathered_with(monkeypatch: pytest.MonkeyPatch, path: Path, data: dict[str, np.ndarray], threshold: int) -> set:
    """One pass with ``STREAM_MIN_BYTES`` at ``threshold``: the ``stream`` each gather was given (batches checked)."""
    monkeypatch.setattr(batch_gather, "STREAM_MIN_BYTES", threshold)
    seen = set()
    real = batch_gather.gather

    def spy(out, tiles, origins, runs, *, stream=None):
        seen.add((out.shape[0], stream))
        real(out, tiles, origins, runs, stream=stream)

    monkeypatch.setattr(batch_gather, "gather", spy)
    with obstore_store(str(path), read_only=True) as store:
        geoms = open_geometries(store, variables=list(ARRAYS))
        manifest = split_by_chunk(geoms["a"], fractions={"train": 1.0})
        with InSituDataset(store, manifest, list(ARRAYS), batch_size=BATCH, shuffle=False) as ds:
            for batch in ds.train:
                for name in ARRAYS:
                    np.testing.assert_array_equal(batch.arrays[name], data[name][batch.sample_indices])
    return seen


def test_a_batch_over_the_threshold_streams_every_array_though_none_is_over_it_alone(monkeypatch, three_arrays):
    path, data = three_arrays
    one_array = BATCH * 10 * 12 * 4  # one array's rows of a full batch
    seen = _gathered_with(monkeypatch, path, data, threshold=2 * one_array)  # the batch: 3 x one_array
    assert seen == {(BATCH, True)}


def test_a_batch_under_the_threshold_is_kept_cached(monkeypatch, three_arrays):
    path, data = three_arrays
    seen = _gathered_with(monkeypatch, path, data, threshold=3 * BATCH * 10 * 12 * 4 + 1)
    assert seen == {(BATCH, False)}


def test_batch_row_bytes_counts_every_array_and_every_step_of_a_window(three_arrays):
    path, _ = three_arrays
    with obstore_store(str(path), read_only=True) as store:
        geoms = open_geometries(store, variables=list(ARRAYS))
    assert batch_gather.batch_row_bytes(geoms.values()) == 3 * 10 * 12 * 4
