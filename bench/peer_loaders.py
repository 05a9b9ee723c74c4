"""The peers insitubatch is measured against: DataLoader over per-sample zarr reads, the fork probe, xbatcher, plain zarr.

Each ``run_*`` takes a measurement's JSON config (``bench.child``) and
returns its row. The worker baselines read one sample per ``__getitem__``
as a hand-written map-style dataset does; their rate is taken from the
first batch on, in their favour.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .measure import PeakRSS, measure, result_row
from .split_tiles import geometries, open_store, train_indices

__all__ = [
    "FORK_VARIANTS",
    "PerSampleZarrDataset",
    "run_dataloader",
    "run_fork_probe",
    "run_xbatcher",
    "run_zarr",
]


# -- per-sample DataLoader baseline ------------------------------------------------------
class PerSampleZarrDataset:
    """Map-style dataset: ``ds[i]`` is sample ``i`` of every variable, read with zarr-python.

    The store is opened lazily in whichever process calls ``__getitem__``
    (so each DataLoader worker opens its own), unless ``reopen_in_worker`` is
    False, in which case a store opened in the parent is used as inherited —
    what the fork probe needs. Plain object with ``__len__``/``__getitem__``:
    DataLoader takes it without importing torch here.
    """

    def __init__(self, url: str, variables: Sequence[str], n_samples: int, *, reopen_in_worker: bool = True) -> None:
        self.url = url
        self.variables = tuple(variables)
        self.n_samples = int(n_samples)
        self.reopen_in_worker = reopen_in_worker
        self._arrays: list[Any] | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.reopen_in_worker:  # spawn/forkserver pickle the dataset: never ship open handles
            state["_arrays"], state["_pid"] = None, None
        return state

    def _open(self) -> list[Any]:
        if self._arrays is None or (self.reopen_in_worker and self._pid != os.getpid()):
            import zarr

            group = zarr.open_group(open_store(self.url), mode="r")
            self._arrays = [group[v] for v in self.variables]
            self._pid = os.getpid()
        return self._arrays

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, i: int) -> dict[str, Any]:
        # one variable after another, as a hand-written __getitem__ does
        sample = {v: a[int(i)] for v, a in zip(self.variables, self._open())}
        sample["index"] = int(i)
        return sample


def _dataloader(cfg: dict[str, Any], dataset: Any, sampler: Any, **extra: Any) -> Any:
    import torch.utils.data

    workers = int(cfg.get("num_workers", 0))
    options: dict[str, Any] = {}
    if workers > 0:
        options["multiprocessing_context"] = cfg.get("start_method", "spawn")
        options["persistent_workers"] = False
    return torch.utils.data.DataLoader(dataset, num_workers=workers, sampler=sampler, **options, **extra)


def run_dataloader(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    store = open_store(cfg["url"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    n = next(iter(geoms.values())).n_samples
    del store  # the workers open their own

    def start() -> Iterator[Any]:
        dataset = PerSampleZarrDataset(cfg["url"], cfg["variables"], n)
        generator = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
        sampler = torch.utils.data.SubsetRandomSampler(train.tolist(), generator=generator)
        return iter(_dataloader(cfg, dataset, sampler, batch_size=int(cfg["batch_size"])))

    m = measure(
        start,
        lambda b: b["index"].numpy(),
        window_s=float(cfg["window_s"]),
        round_batches=max(1, int(cfg.get("num_workers", 0))),
        max_batches=cfg.get("max_batches"),
    )
    return result_row(cfg, m, geoms)


# -- fork probe ----------------------------------------------------------------------------
FORK_VARIANTS = ("inherit", "reopen", "clean")


def run_fork_probe(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ask ``fork`` workers for one batch under a hard timeout; the outcome is the finding.

    ``variant`` (one of :data:`FORK_VARIANTS`):

    ``inherit``
        the parent opens the store and reads a sample; the workers use that
        open store as inherited across the fork;
    ``reopen``
        the parent reads as above; each worker opens a new store after the fork;
    ``clean``
        the parent never touches the store (``n_samples`` comes from the
        config); each worker opens its own.

    On timeout the workers are killed by pid and the outcome is ``"hang"``.
    """
    import torch

    variant = cfg["variant"]
    if variant not in FORK_VARIANTS:
        raise ValueError(f"variant={variant!r} must be one of {FORK_VARIANTS}")
    timeout = float(cfg["timeout_s"])
    dataset = PerSampleZarrDataset(
        cfg["url"], cfg["variables"], int(cfg["n_samples"]), reopen_in_worker=variant != "inherit"
    )
    if variant != "clean":
        dataset[0]  # the parent reads: obstore's runtime and zarr's loop are now live in this process
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        t0 = time.perf_counter()
        try:
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=int(cfg["batch_size"]), num_workers=2, multiprocessing_context="fork"
            )
            batch = next(iter(loader))
            outcome.update(outcome="ok", seconds=time.perf_counter() - t0, samples=len(batch["index"]))
        except Exception as exc:  # what fork does is the finding
            outcome.update(
                outcome="raised", seconds=time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:500]
            )

    thread = threading.Thread(target=attempt, name="fork-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        workers = PeakRSS().tree()[1:]
        outcome.update(outcome="hang", seconds=timeout, workers=len(workers))
        for pid in workers:  # our own DataLoader workers, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return {"name": cfg["name"], "loader": "fork_probe", "variant": variant, "timeout_s": timeout, **outcome}


# -- xbatcher baseline ----------------------------------------------------------------------
class _StackVariables:
    """xbatcher transform: a batch Dataset → ``(batch, variable, lat, lon)`` tensor (picklable)."""

    def __init__(self, variables: Sequence[str]) -> None:
        self.variables = tuple(variables)

    def __call__(self, batch: Any) -> Any:
        import torch

        return torch.from_numpy(np.stack([batch[v].values for v in self.variables], axis=1))


class _XbatcherItems:
    """Wraps xbatcher's MapDataset so each item also says which samples it holds."""

    def __init__(self, inner: Any, starts: np.ndarray, batch_size: int, stop: int) -> None:
        self.inner, self.starts, self.batch_size, self.stop = inner, starts, batch_size, stop

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import torch

        start = int(self.starts[i])
        return self.inner[i], torch.arange(start, min(start + self.batch_size, self.stop))


def run_xbatcher(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import xarray as xr
    import xbatcher
    from xbatcher.loaders.torch import MapDataset

    store = open_store(cfg["url"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    lo, hi = int(train.min()), int(train.max()) + 1
    bs = int(cfg["batch_size"])
    g0 = next(iter(geoms.values()))
    inner = dict(zip(("lat", "lon"), g0.inner_shape))
    chunks = cfg.get("xarray_chunks")  # None: lazy zarr arrays, no dask; {}: one dask chunk per zarr chunk

    def start() -> Iterator[Any]:
        ds = xr.open_zarr(open_store(cfg["url"]), chunks=chunks)[list(cfg["variables"])].isel(time=slice(lo, hi))
        gen = xbatcher.BatchGenerator(ds, input_dims=inner, batch_dims={"time": bs}, concat_input_dims=False)
        items = _XbatcherItems(
            MapDataset(gen, transform=_StackVariables(cfg["variables"])), np.arange(lo, hi, bs), bs, hi
        )
        generator = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
        sampler = torch.utils.data.RandomSampler(items, generator=generator)
        return iter(_dataloader(cfg, items, sampler, batch_size=None))

    m = measure(
        start,
        lambda b: b[1].numpy(),
        window_s=float(cfg["window_s"]),
        round_batches=max(1, int(cfg.get("num_workers", 0))),
        max_batches=cfg.get("max_batches"),
    )
    return result_row(cfg, m, geoms)


# -- plain zarr baseline ---------------------------------------------------------------------
def run_zarr(cfg: dict[str, Any]) -> dict[str, Any]:
    import zarr

    store = open_store(cfg["url"])
    geoms = geometries(store, cfg["variables"])
    train = train_indices(geoms, cfg["fractions"])
    lo, hi = int(train.min()), int(train.max()) + 1
    bs = int(cfg["batch_size"])

    def start() -> Iterator[Any]:
        group = zarr.open_group(open_store(cfg["url"]), mode="r")
        arrays = [group[v] for v in cfg["variables"]]
        for s in range(lo, hi, bs):
            e = min(s + bs, hi)
            yield [a[s:e] for a in arrays], np.arange(s, e)

    m = measure(start, lambda b: b[1], window_s=float(cfg["window_s"]), max_batches=cfg.get("max_batches"))
    return result_row(cfg, m, geoms)
