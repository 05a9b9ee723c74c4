"""One measurement in a fresh interpreter: ``main`` reads a JSON config, runs its loader, prints one result line.

This is the one child every bench measurement runs in, the report's
(:class:`bench.children.Bench`) and the arena's (:mod:`bench.arena.run`):
the parent (:class:`bench.children.Children`) starts :func:`main` with a
JSON config in a new interpreter, kills it on a timeout and reads the line
``RESULT {json}`` it prints: the loader's row plus the peak RSS, the Python
it ran on and the load average when it finished. A loader that raises is a
row with ``error``. :func:`measure` runs the same in the calling process
(the report's quick profile does, to pay the imports once). A fresh
interpreter per run keeps the measurements apart: peak RSS is this run's
own, each time to first batch starts from a process with its imports done
but nothing opened, and a hung loader is killed without taking the report
with it.

Each loader's module is imported only when asked for (:data:`LOADERS` names
it), and this module imports only the standard library and numpy, so the
arena's reference child, which runs in the reference's own virtual
environment with this repository appended to ``sys.path``, loads nothing of
this repository's ``insitubatch``.

Config keys every loader reads: ``loader``, ``variables``, ``fractions``,
``batch_size``, ``window_s`` and ``location`` (where the data is:
:func:`bench.split_tiles.open_location`); the report's loaders also read
``url`` and ``local_path``. ``preload``: modules imported before the
loader's clock starts (a training script's imports). ``peak_rss``:
``"tree"`` samples this process and its workers (the report's worker
loaders; ``rss_exclude_pids`` leaves an emulator's subtree out),
``"process"`` (the default) reads this process's own high-water mark.

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
    The split's stored chunks, read from disk into memory, decoded on a
    thread pool of every core (``decoder``: insitubatch's or numcodecs').
``get_ceiling``
    The split's stored-chunk GETs alone, ``concurrency`` at a time, through
    obstore, no decode.
``ours``, ``reference``, ``tensorstore``
    The arena's loaders in steady state, or over one cold pass with
    ``mode="cold"`` (:mod:`bench.arena.ours`, :mod:`bench.arena.reference`,
    :mod:`bench.arena.tensorstore_loop`).

The report's peers are ``bench.peer_loaders``, insitubatch's
``bench.insitu_loaders``, the ceilings ``bench.ceilings``; ``bench.measure``
times the report's loaders and ``bench.arena.harness`` the arena's.

Every report row has three rates: ``samples_per_s`` from the very start (store
opened, nothing built) to the last batch; ``pass_samples_per_s`` from the
moment the loader was built and iterating; ``steady_samples_per_s`` from
the first batch on, ended on a whole round of worker batches (see
:func:`~bench.measure.measure`). The report compares ``rate_samples_per_s``: the steady
rate for the baselines (their start-up left out, in their favour) and the
pass rate for insitubatch (its pipeline fill counted, against it).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .measure import loadavg, rss_bytes
from .rows import MB

__all__ = ["LOADERS", "RESULT_PREFIX", "main", "measure"]

RESULT_PREFIX = "RESULT "
# Every loader a child runs, as "module:function"; the module is imported when its loader is asked for.
LOADERS: dict[str, str] = {
    "dataloader": "bench.peer_loaders:run_dataloader",
    "fork_probe": "bench.peer_loaders:run_fork_probe",
    "xbatcher": "bench.peer_loaders:run_xbatcher",
    "zarr": "bench.peer_loaders:run_zarr",
    "insitu": "bench.insitu_loaders:run_insitu",
    "insitu_warm": "bench.insitu_loaders:run_insitu_warm",
    "insitu_persist": "bench.insitu_loaders:run_insitu_persist",
    "insitu_steady": "bench.insitu_loaders:run_insitu_steady",
    "decode_ceiling": "bench.ceilings:run_decode_ceiling",
    "get_ceiling": "bench.ceilings:run_get_ceiling",
    "ours": "bench.arena.ours:run_ours",
    "reference": "bench.arena.reference:run_reference",
    "tensorstore": "bench.arena.tensorstore_loop:run_tensorstore",
}
# The longest error message a row keeps (a traceback goes to the child's stderr).
ERROR_CHARS = 600


def runner(loader: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function that measures ``loader``, its module imported now (and only its own)."""
    target = LOADERS.get(loader)
    if target is None:
        raise ValueError(f"loader={loader!r} is not one of {sorted(LOADERS)}")
    module, name = target.split(":")
    fn: Callable[[dict[str, Any]], dict[str, Any]] = getattr(importlib.import_module(module), name)
    return fn


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run ``cfg``'s loader in this process; its row with the peak RSS, never an exception."""
    try:
        for module in cfg.get("preload", ()):  # before the loader's clock starts, as in a training script
            importlib.import_module(module)
        run = runner(cfg["loader"])
        if cfg.get("peak_rss") == "tree":
            from .measure import PeakRSS

            with PeakRSS(exclude_pids=cfg.get("rss_exclude_pids", ())) as rss:
                row = run(cfg)
            row.update(peak_rss_mb=rss.peak / MB, base_rss_mb=rss.base / MB)
        else:
            row = run(cfg)
            row["peak_rss_mb"] = rss_bytes("VmHWM") / MB
    except Exception as exc:  # a failed loader is a row of the report, not the end of it
        row = {"error": f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]}
        traceback.print_exc(file=sys.stderr)
    row.setdefault("loader", cfg["loader"])
    if "scenario" in cfg:
        row["scenario"] = cfg["scenario"]
    row.update(python=platform.python_version(), loadavg_end=loadavg())
    return row


def main(argv: list[str] | None = None) -> None:
    """``main(['<json config>'])``: measure, print the result line, and leave at once (no thread may hang us)."""
    argv = sys.argv[1:] if argv is None else argv
    row = measure(json.loads(argv[0]))
    sys.stderr.flush()
    print(RESULT_PREFIX + json.dumps(row), flush=True)
    os._exit(0)  # a hung fork worker or a wedged store must not keep the child alive
