"""Every public knob refuses a bad value with ValueError/TypeError naming the parameter, the value and what is valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from helpers import smooth_field, write_array

from insitubatch.dataset import InSituDataset
from insitubatch.io.group import open_geometries
from insitubatch.plan.splits import split_by_chunk
from insitubatch.transforms import applies

N = 30


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("params") / "p.zarr"
    root = zarr.open_group(path, mode="w")
    rng = np.random.default_rng(0)
    write_array(root, "t2m", smooth_field(rng, (N, 4, 5)), (4, 4, 5), dims=("time", "lat", "lon"))
    write_array(root, "u10", smooth_field(rng, (N, 4, 5)), (6, 2, 5), dims=("time", "lat", "lon"))
    write_array(root, "longer", smooth_field(rng, (N + 3, 2)), (4, 2))
    return path


@pytest.fixture(scope="module")
def manifest(path):
    return split_by_chunk(open_geometries(str(path))["t2m"], fractions=(0.5, 0.5))


def _raises(exc: type[Exception], match: str):
    return pytest.raises(exc, match=match)


# --- InSituDataset ----------------------------------------------------------------

BAD_DATASET_KNOBS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"batch_size": 0}, ValueError, r"batch_size=0 must be >= 1"),
    ({"batch_size": -3}, ValueError, r"batch_size=-3 must be >= 1"),
    ({"batch_size": 2.5}, TypeError, r"batch_size must be an int, got float \(2\.5\)"),
    ({"batch_size": True}, TypeError, r"batch_size must be an int, got bool \(True\)"),
    ({"batch_size": "8"}, TypeError, r"batch_size must be an int, got str \('8'\)"),
    ({"block_chunks": 0}, ValueError, r"block_chunks=0 must be >= 1"),
    ({"block_chunks": None}, TypeError, r"block_chunks must be an int, got NoneType \(None\)"),
    ({"max_inflight": 0}, ValueError, r"max_inflight=0 must be >= 1"),
    ({"max_inflight": 1.0}, TypeError, r"max_inflight must be an int, got float \(1\.0\)"),
    ({"prefetch_depth": 0}, ValueError, r"prefetch_depth=0 must be >= 1"),
    ({"prefetch_depth": -1}, ValueError, r"prefetch_depth=-1 must be >= 1"),
    ({"decode_threads": 0}, ValueError, r"decode_threads=0 must be >= 1"),
    ({"cache_budget_bytes": 0}, ValueError, r"cache_budget_bytes=0 must be >= 1"),
    ({"cache_budget_bytes": 1e9}, TypeError, r"cache_budget_bytes must be an int, got float"),
    ({"seed": -1}, ValueError, r"seed=-1 must be >= 0"),
    ({"seed": "7"}, TypeError, r"seed must be an int, got str \('7'\)"),
    *[
        ({knob: 2**64}, ValueError, rf"{knob}=18446744073709551616 must be <= 9223372036854775807")
        for knob in (
            "batch_size",
            "block_chunks",
            "max_inflight",
            "prefetch_depth",
            "decode_threads",
            "cache_budget_bytes",
            "cache_disk_bytes",
            "seed",
        )
    ],
    ({"rank": 0, "world_size": 2**64}, ValueError, r"world_size=18446744073709551616 must be <= 9223372036854775807"),
    ({"shuffle": "false"}, TypeError, r"shuffle must be True or False, got str \('false'\)"),
    ({"shuffle": 1}, TypeError, r"shuffle must be True or False, got int \(1\)"),
    ({"on_bad_chunk": "skip"}, ValueError, r"on_bad_chunk='skip' must be one of \('raise', 'nan'\)"),
    ({"remainder": "even"}, ValueError, r"remainder='even' must be one of \('pad', 'drop'\)"),
    ({"rank": 2, "world_size": 2}, ValueError, r"rank=2 must be in \[0, world_size=2\)"),
    ({"rank": 0, "world_size": 0}, ValueError, r"world_size=0 must be >= 1"),
    ({"rank": "0", "world_size": 2}, TypeError, r"rank must be an int, got str \('0'\)"),
    ({"persist": True}, ValueError, r"persist=True, .* need a cache_dir"),
    ({"persist": "yes"}, TypeError, r"persist must be True or False, got str \('yes'\)"),
    ({"readonly_cache": 1}, TypeError, r"readonly_cache must be True or False, got int \(1\)"),
    ({"reset_stale_cache": None}, TypeError, r"reset_stale_cache must be True or False, got NoneType"),
    ({"cache_dir": 5}, TypeError, r"cache_dir must be a directory path .* got int \(5\)"),
    (
        {
            "cache_dir": "/nonexistent-insitubatch-cache",
            "persist": True,
            "readonly_cache": True,
            "reset_stale_cache": True,
        },
        ValueError,
        r"reset_stale_cache=True deletes files, which a readonly_cache never does; drop one of them",
    ),
    ({"chunk_transforms": lambda c: c}, TypeError, r"chunk_transforms must be a list of callables, got function"),
    ({"chunk_transforms": [5]}, TypeError, r"chunk_transforms\[0\] must be callable, got int \(5\)"),
    ({"batch_transforms": [lambda b: b, None]}, TypeError, r"batch_transforms\[1\] must be callable, got NoneType"),
    ({"batch_transforms": "scale"}, TypeError, r"batch_transforms must be a list of callables, got str \('scale'\)"),
    ({"chunk_transforms": [applies(["zz"], lambda c: c)]}, ValueError, r"names \['zz'\], which are not arrays"),
    ({"variables": "t2m"}, TypeError, r"variables must be a mapping .* got str"),
    ({"variables": ["nope"]}, ValueError, r"variable 'nope' is not an array in the store .*; arrays are \["),
    ({"variables": {"x": "t2m"}}, TypeError, r"variables\['x'\] must be an ArrayGeometry .* got str"),
    ({"variables": {}}, ValueError, r"variables is empty"),
    (
        {"variables": ["t2m", "longer"]},
        ValueError,
        r"manifest's 30 samples along its sample axis; these differ: \{'longer': 33\}",
    ),
]


@pytest.mark.parametrize(
    "kwargs, exc, match", BAD_DATASET_KNOBS, ids=lambda v: repr(v)[:40] if isinstance(v, dict) else ""
)
def test_dataset_knobs_are_validated(path, manifest, kwargs, exc, match) -> None:
    kwargs = dict(kwargs)
    kwargs.setdefault("variables", ["t2m"])
    with _raises(exc, match):
        InSituDataset(str(path), manifest, **kwargs)


def test_readonly_cache_without_persist_is_refused(path, manifest, tmp_path) -> None:
    with _raises(ValueError, r"readonly_cache=True reads a persisted cache: pass persist=True"):
        InSituDataset(str(path), manifest, ["t2m"], cache_dir=tmp_path / "c", readonly_cache=True)


def test_store_and_manifest_of_the_wrong_type(path, manifest) -> None:
    with _raises(TypeError, r"store=42 is a int, which cannot be made a zarr store; expected"):
        InSituDataset(42, manifest, ["t2m"])
    with _raises(TypeError, r"manifest must be a SplitManifest .* got dict"):
        InSituDataset(str(path), {"train": [0]}, ["t2m"])


def test_a_budget_below_the_working_set_raises_when_the_pass_starts(path, manifest) -> None:
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4, block_chunks=2, cache_budget_bytes=100) as ds:
        floor = ds.train.plan().working_set_bytes
        with _raises(
            ValueError,
            rf"cache_budget_bytes=100 cannot hold this iteration's working set of {floor} bytes"
            rf".*at least {floor}",
        ):
            iter(ds.train)


def test_unknown_split_and_label_names(path, manifest) -> None:
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4) as ds:
        with _raises(KeyError, r"split 'valid' is not in the manifest; splits are \['train', 'val'\]"):
            ds.split("valid")
        batch = next(iter(ds.train))
        with _raises(KeyError, r"label 'u10' is not in this batch; labels are \['t2m'\]"):
            batch.read_indices("u10")
        with _raises(KeyError, r"labels \['u10'\] are not in this batch"):
            batch.stack(["t2m", "u10"])


def test_epoch_and_start_batch_are_validated(path, manifest) -> None:
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4) as ds:
        with _raises(ValueError, r"epoch=-1 must be >= 0"):
            ds.set_epoch(-1)
        with _raises(TypeError, r"epoch must be an int, got str \('1'\)"):
            ds.train.set_epoch("1")
        with _raises(ValueError, r"start_batch=-1 must be >= 0"):
            ds.train.iterate(-1)
        with _raises(TypeError, r"start_batch must be an int, got float \(1\.5\)"):
            ds.train.iterate(1.5)
        n = len(ds.train)
        with _raises(ValueError, rf"start_batch=99 must be in \[0, {n}\] for split 'train'"):
            ds.train.iterate(99)


# --- split_by_chunk ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"fractions": (0.5, 0.6)}, ValueError, r"fractions \{'train': 0\.5, 'val': 0\.6\} sum to 1\.1"),
        (
            {"fractions": (1.5, -0.5)},
            ValueError,
            r"fraction for split 'train' is 1\.5; each fraction must be in \[0, 1\]",
        ),
        ({"fractions": {"train": "most"}}, TypeError, r"fraction for split 'train' must be a number, got 'most'"),
        ({"fractions": ()}, ValueError, r"fractions=\(\) must have 1 to 3 entries"),
        ({"fractions": {}}, ValueError, r"fractions must name at least one split"),
        ({"seed": -2}, ValueError, r"seed=-2 must be >= 0"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got float \(1\.5\)"),
        ({"contiguous": "no"}, TypeError, r"contiguous must be True or False, got str \('no'\)"),
        ({"sample_range": (5,)}, ValueError, r"sample_range=\(5,\) must be a \(start, stop\) pair of ints"),
        ({"sample_range": (0, 31)}, ValueError, r"sample_range=\(0, 31\) must satisfy 0 <= start < stop <= 30"),
        ({"sample_range": (9, 9)}, ValueError, r"sample_range=\(9, 9\) must satisfy"),
    ],
)
def test_split_by_chunk_knobs_are_validated(path, kwargs, exc, match) -> None:
    g = open_geometries(str(path))["t2m"]
    with _raises(exc, match):
        split_by_chunk(g, **kwargs)


def test_split_by_chunk_needs_a_geometry() -> None:
    with _raises(TypeError, r"geometry must be an ArrayGeometry, got str"):
        split_by_chunk("t2m")


# --- open_geometries --------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"sample_axis": 3}, ValueError, r"sample_axis=3 is out of range for array '\w+' with \d dims"),
        ({"sample_axis": "0"}, TypeError, r"sample_axis must be an int, got str \('0'\)"),
        ({"variables": "t2m"}, TypeError, r"variables must be a list of array paths, not a single string"),
        ({"variables": ["t2m", "sst"]}, ValueError, r"variable 'sst' is not an array in the store .*; arrays are"),
        ({"group": 3}, TypeError, r"group must be a str .* got int \(3\)"),
        ({"max_chunk_bytes": 0}, ValueError, r"max_chunk_bytes=0 must be >= 1"),
        ({"max_chunk_bytes": "1GB"}, TypeError, r"max_chunk_bytes must be an int \(bytes\) or None, got str"),
        ({"max_chunk_bytes": 64}, ValueError, r"array '\w+' .* decodes to \d+ bytes, over max_chunk_bytes=64"),
    ],
)
def test_open_geometries_knobs_are_validated(path, kwargs, exc, match) -> None:
    with _raises(exc, match):
        open_geometries(str(path), **kwargs)


def test_open_geometries_of_something_that_is_no_store() -> None:
    with _raises(TypeError, r"store=3\.5 is a float, which cannot be made a zarr store"):
        open_geometries(3.5)


def test_chunk_byte_limit_from_the_environment_is_validated(path, monkeypatch) -> None:
    monkeypatch.setenv("INSITUBATCH_MAX_CHUNK_BYTES", "lots")
    with _raises(ValueError, r"INSITUBATCH_MAX_CHUNK_BYTES='lots' must be a positive integer number of bytes"):
        open_geometries(str(path))


# --- infer ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (((5, 2),), {}, r"sample_range=\(5, 2\) must satisfy 0 <= start < stop <= 30"),
        (((0, 31),), {}, r"sample_range=\(0, 31\) must satisfy 0 <= start < stop <= 30"),
        (("ab",), {}, r"sample_range='ab' must be a \(start, stop\) pair of ints"),
        (
            ((20, 30),),
            {},
            r"label 'y' reads anchor \+ 3, so sample_range=\(20, 30\) would read \[23, 33\) off its array",
        ),
        (((0, 10),), {"batch_size": 0}, r"batch_size=0 must be >= 1"),
    ],
)
def test_infer_knobs_are_validated(path, manifest, args, kwargs, match) -> None:
    g = open_geometries(str(path))["t2m"]
    with InSituDataset(str(path), manifest, {"x": g, "y": g.shift(3)}) as ds:
        with _raises(ValueError, match):
            ds.infer(*args, **kwargs)


# --- load_state_dict --------------------------------------------------------------


def test_load_state_dict_names_what_is_wrong(path, manifest) -> None:
    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4, seed=3) as ds:
        view = ds.train
        good = view.state_dict()
        with _raises(TypeError, r"state must be a mapping from state_dict\(\), got str"):
            view.load_state_dict("epoch 3")
        with _raises(ValueError, r"state\['format'\]=None is not the supported 1"):
            view.load_state_dict({})
        with _raises(ValueError, r"seed: saved 4, this dataset has 3"):
            view.load_state_dict({**good, "seed": 4})
        with _raises(ValueError, r"split: saved 'val', this dataset has 'train'"):
            view.load_state_dict({**good, "split": "val"})
        with _raises(ValueError, r"state\['epoch'\]=-1 must be >= 0"):
            view.load_state_dict({**good, "epoch": -1})
        with _raises(TypeError, r"state\['batches_consumed'\] must be an int, got str \('2'\)"):
            view.load_state_dict({**good, "batches_consumed": "2"})
        n = len(view)
        with _raises(ValueError, rf"state\['batches_consumed'\]=99 exceeds the {n} batches of epoch 0"):
            view.load_state_dict({**good, "batches_consumed": 99})
        with _raises(ValueError, r"state\['history'\]='x' must be a list of \[world_size, batches\]"):
            view.load_state_dict({**good, "history": "x"})
        view.load_state_dict(good)  # the real thing still loads


# --- as_torch ---------------------------------------------------------------------


def test_as_torch_knobs_are_validated(path, manifest) -> None:
    pytest.importorskip("torch")
    from insitubatch.adapters import as_torch

    with InSituDataset(str(path), manifest, ["t2m"], batch_size=4) as ds:
        with _raises(TypeError, r"view must be a DatasetView .* got InSituDataset"):
            as_torch(ds)
        with _raises(ValueError, r"device='gpu0' is not a torch device"):
            as_torch(ds.train, device="gpu0")
        with _raises(TypeError, r"device_transform must be callable, got int"):
            as_torch(ds.train, device_transform=3)
