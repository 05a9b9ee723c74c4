"""The loaders the report measures, each run alone in a fresh child process.

``python -m bench.baselines '<json config>'`` (or :func:`main`) runs one
measurement and prints one line ``RESULT {json}``; :func:`run_config` runs
it in the calling process instead (the quick profile does, to pay the
imports once). A fresh interpreter per run keeps the
measurements apart: peak RSS is this run's own (the child and its workers,
never a previous loader's heap), each TTFB starts from a process with its
imports done but nothing opened, and a hung loader is killed without taking
the report with it. The parent (``bench.run``) resets the emulator's
counters before each run and reads them after.

Loaders (``config["loader"]``):

``dataloader``
    ``torch.utils.data.DataLoader`` over :class:`PerSampleZarrDataset`, a
    map-style dataset whose ``__getitem__`` reads one sample of every
    variable with zarr-python through obstore, the store opened lazily in
    each worker process; ``num_workers`` and ``start_method`` from the config.
``fork_probe``
    The same dataset handed to ``fork`` workers, in three variants (see
    :func:`~bench.peer_loaders.run_fork_probe`); reports whether a first batch arrives before a
    hard timeout (a finding, not a throughput row).
``xbatcher``
    ``xr.open_zarr`` + ``xbatcher.BatchGenerator`` (contiguous time batches)
    + ``xbatcher.loaders.torch.MapDataset`` in a DataLoader, batch order
    shuffled.
``zarr``
    Plain zarr-python reading contiguous batches in order (a sequential best case).
``insitu``
    ``InSituDataset`` cold: a fresh dataset, automatic budget.
``insitu_warm``
    A dataset whose pool holds the whole split: one epoch to fill it, then
    the measured epoch served from memory.
``insitu_persist``
    With ``cache_dir`` and ``persist=True`` (only when ``InSituDataset``
    accepts them): ``phase`` ``"fill"`` writes the cache, ``"warm"`` reads it
    in a new process.
``insitu_steady``
    One dataset, passes back to back: ``warmup_s`` seconds untimed (the
    self-tuning window settles), then ``window_s`` seconds timed, with the
    process's CPU per sample and the last pass's reads-in-flight stats
    (``bench.network``).
``decode_ceiling``
    The split's stored chunks, read from disk into memory, decoded with
    ``insitubatch.io.decode.make_decoder`` on a thread pool of every core.
``get_ceiling``
    The split's stored-chunk GETs alone, ``concurrency`` at a time, through
    obstore, no decode.

The peers are ``bench.peer_loaders``, insitubatch ``bench.insitu_loaders``
and the ceilings ``bench.ceilings``; ``bench.measure`` times each of them.

Every row has three rates: ``samples_per_s`` from the very start (store
opened, nothing built) to the last batch; ``pass_samples_per_s`` from the
moment the loader was built and iterating; ``steady_samples_per_s`` from
the first batch on, ended on a whole round of worker batches (see
:func:`~bench.measure.measure`). The report compares ``rate_samples_per_s``: the steady
rate for the baselines (their start-up left out, in their favour) and the
pass rate for insitubatch (its pipeline fill counted, against it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from .ceilings import run_decode_ceiling, run_get_ceiling
from .insitu_loaders import run_insitu, run_insitu_persist, run_insitu_steady, run_insitu_warm
from .measure import PeakRSS
from .peer_loaders import run_dataloader, run_fork_probe, run_xbatcher, run_zarr
from .rows import MB

__all__ = ["RESULT_PREFIX", "main", "run_config"]

RESULT_PREFIX = "RESULT "


_RUNNERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "dataloader": run_dataloader,
    "fork_probe": run_fork_probe,
    "xbatcher": run_xbatcher,
    "zarr": run_zarr,
    "insitu": run_insitu,
    "insitu_warm": run_insitu_warm,
    "insitu_persist": run_insitu_persist,
    "insitu_steady": run_insitu_steady,
    "decode_ceiling": run_decode_ceiling,
    "get_ceiling": run_get_ceiling,
}


def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process; returns its result row (RSS included)."""
    runner = _RUNNERS.get(cfg["loader"])
    if runner is None:
        raise ValueError(f"loader={cfg['loader']!r} is not one of {sorted(_RUNNERS)}")
    with PeakRSS(exclude_pids=cfg.get("rss_exclude_pids", ())) as rss:
        result = runner(cfg)
    result.update(peak_rss_mb=rss.peak / MB, base_rss_mb=rss.base / MB)
    return result


def _preload(modules: Iterable[str]) -> None:
    for name in modules:
        __import__(name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    # imports happen before the clock starts, as in a training script
    _preload(cfg.get("preload", ()))
    result = run_config(cfg)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    sys.stdout.flush()
    # a hung fork worker or a wedged store must not keep the child alive
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
