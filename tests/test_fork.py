"""Processes a user starts: a worker forked after the parent read reads correctly or fails at once naming fork.

Each pattern runs as a real script in a subprocess with a hard timeout: the
parent reads (so obstore's runtime threads run in it), then maps over a
``fork`` multiprocessing pool whose worker opens its own dataset and reads
a whole pass. A local directory is read in the worker (its files, without
obstore); a store only obstore can read refuses its first use there with
:class:`~insitubatch.errors.ForkError`, whose message names fork and the way out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

# The whole script: two interpreters' start-up and imports on a loaded 2-core machine, two short passes. A
# hang is forever; a refusal comes at the store's first request, well inside this.
SCRIPT_TIMEOUT_S = 90.0
SHAPE, CHUNKS = (64, 4, 4), (8, 4, 4)

FORK_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing as mp, sys, time
    import numpy as np, zarr
    import insitubatch as ib
    from insitubatch.errors import ForkError

    url, options, oracle_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    expected = np.load(oracle_path)


    def read(_):
        start = time.monotonic()
        try:
            store = ib.obstore_store(url, read_only=True, **options)
            geoms = ib.open_geometries(store, variables=["a"])
            manifest = ib.split_by_chunk(geoms["a"], fractions=(1.0, 0.0, 0.0))
            with ib.InSituDataset(store, manifest, geoms, batch_size=8) as ds:
                seen = []
                for batch in ds.train:
                    assert np.array_equal(batch.arrays["a"], expected[batch.sample_indices])
                    seen.extend(int(i) for i in batch.sample_indices)
            return ["read", sorted(seen)]
        except ForkError as exc:
            return ["fork", type(exc).__name__, str(exc), time.monotonic() - start]


    if __name__ == "__main__":
        print(json.dumps(read(0)), flush=True)
        with mp.get_context("fork").Pool(1) as pool:
            print(json.dumps(pool.map(read, [0])[0]), flush=True)
    """
)


def _write(store: object) -> np.ndarray:
    values = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)
    zarr.open_group(store, mode="w").create_array("a", shape=SHAPE, chunks=CHUNKS, dtype="f4")[...] = values
    return values


def _run(script: str, *args: str) -> list[list]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _fork_pool(url: str, options: dict, oracle: np.ndarray, tmp_path: Path) -> tuple[list, list]:
    np.save(tmp_path / "oracle.npy", oracle)
    parent, worker = _run(FORK_SCRIPT, url, json.dumps(options), str(tmp_path / "oracle.npy"))
    assert parent == ["read", list(range(SHAPE[0]))]
    return parent, worker


# A refusal is made before any request is sent: far under obstore's own retry bound (45 s), let alone forever.
REFUSED_WITHIN_S = 5.0


def _assert_refused_naming_fork(worker: list) -> None:
    assert worker[:2] == ["fork", "ForkError"], worker
    assert "fork" in worker[2] and 'get_context("forkserver")' in worker[2] and '"spawn"' in worker[2]
    assert worker[3] < REFUSED_WITHIN_S


def test_a_worker_forked_after_the_parent_read_reads_a_local_directory(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    oracle = _write(zarr.storage.LocalStore(path))
    _, worker = _fork_pool(str(path), {}, oracle, tmp_path)
    assert worker == ["read", list(range(SHAPE[0]))]


def test_a_worker_forked_after_the_parent_read_over_http_reads_with_the_engines_client(
    http_server, tmp_path: Path
) -> None:
    oracle = _write(zarr.storage.LocalStore(http_server.root / "d.zarr"))
    _, worker = _fork_pool(f"{http_server.url}/d.zarr", {}, oracle, tmp_path)
    assert worker == ["read", list(range(SHAPE[0]))]


def test_a_worker_forked_after_the_parent_read_from_s3_reads_with_the_engines_client(
    s3_server, write_s3_store, s3_bucket: str, tmp_path: Path
) -> None:
    oracle = _write(write_s3_store)
    _, worker = _fork_pool(f"s3://{s3_bucket}", s3_server.client_options(), oracle, tmp_path)
    assert worker == ["read", list(range(SHAPE[0]))]


def test_a_worker_forked_after_the_parent_read_fails_at_once_where_only_obstore_can_read(
    http_server, tmp_path: Path
) -> None:
    oracle = _write(zarr.storage.LocalStore(http_server.root / "d.zarr"))
    # a custom header is one setting the engine's client does not apply: obstore's keeps the store
    options = {"client_options": {"default_headers": {"x-trace": "1"}}}
    _, worker = _fork_pool(f"{http_server.url}/d.zarr", options, oracle, tmp_path)
    _assert_refused_naming_fork(worker)


# --- a store object built in the parent, or a caller's own, used in the worker --------------------------

INHERITED_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing as mp, sys
    import numpy as np, zarr
    from obstore.store import LocalStore, MemoryStore
    import insitubatch as ib
    from insitubatch.errors import ForkError

    path = sys.argv[1]
    own = zarr.storage.ObjectStore(LocalStore(path), read_only=True)  # a caller's own, not insitubatch's
    built = ib.obstore_store(path, read_only=True)
    memory = ib.obstore_store("memory://")
    zarr.open_group(memory, mode="w").create_array("a", shape=(4,), chunks=(2,), dtype="i4")[...] = 7
    expected = zarr.open_array(built, path="a", mode="r")[...]  # the parent reads through obstore


    def read(store):
        try:
            geoms = ib.open_geometries(store, variables=["a"])
            manifest = ib.split_by_chunk(geoms["a"], fractions=(1.0, 0.0, 0.0))
            with ib.InSituDataset(store, manifest, geoms, batch_size=8, shuffle=False) as ds:
                got = np.concatenate([b.arrays["a"] for b in ds.train])
            return ["read", bool(np.array_equal(got, expected))]
        except ForkError as exc:
            return ["fork", "fork" in str(exc) and "spawn" in str(exc)]


    def with_zarr(_):
        try:  # plain zarr, no insitubatch call, on the store insitubatch built in the parent
            return ["read", bool(np.array_equal(zarr.open_array(built, path="a", mode="r")[...], expected))]
        except ForkError as exc:
            return ["fork", "fork" in str(exc)]


    def in_memory(_):
        try:
            zarr.open_array(memory, path="a", mode="r")[...]
            return ["read"]
        except ForkError as exc:
            return ["fork", "fork" in str(exc)]


    if __name__ == "__main__":
        with mp.get_context("fork").Pool(1) as pool:
            for result in pool.map(read, [own, built]) + pool.map(with_zarr, [0]) + pool.map(in_memory, [0]):
                print(json.dumps(result), flush=True)
    """
)


def test_stores_made_in_the_parent_read_local_files_in_the_worker_and_refuse_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    _write(zarr.storage.LocalStore(path))
    assert _run(INHERITED_SCRIPT, str(path)) == [
        ["read", True],  # the caller's own zarr ObjectStore over obstore's LocalStore
        ["read", True],  # obstore_store's, built in the parent
        ["read", True],  # the same through plain zarr
        ["fork", True],  # obstore's memory lives behind its runtime: refused at its first request
    ]


FRESH_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, sys
    import zarr
    import insitubatch as ib

    def read(path):
        return float(zarr.open_array(ib.obstore_store(path, read_only=True), path="a", mode="r")[...].sum())

    if __name__ == "__main__":
        with mp.get_context("fork").Pool(1) as pool:  # started before the parent read anything
            print(pool.map(read, [sys.argv[1]])[0], read(sys.argv[1]), flush=True)
    """
)


def test_a_worker_forked_before_the_parent_read_uses_obstore_as_usual(tmp_path: Path) -> None:
    path = tmp_path / "d.zarr"
    oracle = _write(zarr.storage.LocalStore(path))
    done = subprocess.run(
        [sys.executable, "-c", FRESH_SCRIPT, str(path)], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(float(oracle.sum()))] * 2


# --- views stay in the process that opened their dataset ------------------------------------------------

VIEW_SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, pickle, sys
    import insitubatch as ib

    path, case = sys.argv[1], sys.argv[2]
    geoms = ib.open_geometries(path, variables=["a"])
    ds = ib.InSituDataset(path, ib.split_by_chunk(geoms["a"], fractions=(1.0, 0.0, 0.0)), geoms, batch_size=8)


    def report(exc):
        print(type(exc).__name__, "num_workers > 0" in str(exc) and "as_torch(view)" in str(exc), flush=True)


    def iterate(_):
        try:
            return sum(1 for _ in ds.train)
        except RuntimeError as exc:
            return f"{type(exc).__name__} {'num_workers > 0' in str(exc) and 'as_torch(view)' in str(exc)}"


    if case == "pickle":
        import jax, torch
        for view in (ds.train, ds.infer((0, 8)), ib.as_torch(ds.train), ib.to_jax(ds.train)):
            try:
                pickle.dumps(view)
                print("pickled", flush=True)
            except TypeError as exc:
                report(exc)
    elif case == "forked":
        sum(1 for _ in ds.train)
        with mp.get_context("fork").Pool(1) as pool:
            print(pool.map(iterate, [0])[0], flush=True)
    else:
        import torch
        kind, context = case.split("-")
        view = ds.train if kind == "bare" else ib.as_torch(ds.train)
        loader = torch.utils.data.DataLoader(view, batch_size=None, num_workers=2, multiprocessing_context=context)
        try:
            print("batches", sum(1 for _ in loader), flush=True)
        except (TypeError, RuntimeError) as exc:
            report(exc)
    ds.close()
    """
)


def _view_script(tmp_path: Path, case: str) -> list[str]:
    path = tmp_path / "d.zarr"
    if not path.exists():
        _write(zarr.storage.LocalStore(path))
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", VIEW_SCRIPT, str(path), case],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("kind", ["bare", "torch"])
def test_a_dataloader_with_workers_over_any_view_gets_the_one_clear_message(
    tmp_path: Path, kind: str, context: str
) -> None:
    # fork: the workers index (bare) or iterate (torch) the view; spawn: it is pickled to start them
    pytest.importorskip("torch")
    expected = "RuntimeError True" if context == "fork" else "TypeError True"
    assert _view_script(tmp_path, f"{kind}-{context}") == [expected]


def test_pickling_any_view_gets_the_one_clear_message(tmp_path: Path) -> None:
    for framework in ("torch", "jax"):  # the script pickles a TorchView and a JaxView beside the bare views
        pytest.importorskip(framework)
    assert _view_script(tmp_path, "pickle") == ["TypeError True"] * 4


def test_a_view_inherited_by_a_forked_worker_refuses_to_iterate_there(tmp_path: Path) -> None:
    assert _view_script(tmp_path, "forked") == ["RuntimeError True"]


def test_a_bare_view_indexed_in_its_own_process_says_how_to_iterate_it(tmp_path: Path) -> None:
    import insitubatch as ib

    path = tmp_path / "d.zarr"
    _write(zarr.storage.LocalStore(path))
    geoms = ib.open_geometries(str(path), variables=["a"])
    with ib.InSituDataset(str(path), ib.split_by_chunk(geoms["a"], fractions=(1.0,)), geoms, batch_size=8) as ds:
        with pytest.raises(TypeError, match=r"iterated, not indexed \(view\[0\]\).*as_torch\(view\)"):
            ds.train[0]
