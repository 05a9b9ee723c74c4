"""Timing one loader: its batches, time to first batch, steady rate, peak RSS of its process tree, and the row it makes.

:func:`measure` times a loader's batch iterator; :class:`PeakRSS` samples the
memory of this process and its workers meanwhile; :func:`result_row` turns
a :class:`Measurement` into the row the report compares (the rates, the
GETs the samples needed, the samples' bytes). :func:`cpu_s`,
:func:`rss_bytes` and :func:`loadavg` are the process probes every child
(the report's and the arena's) reads its CPU, memory and the machine's load
with.

Standard library and numpy only at import (the split's helpers import
insitubatch when called): the arena's reference child imports this module
from its own virtual environment.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .rows import MB
from .split_tiles import min_gets, sample_nbytes

__all__ = ["Measurement", "PeakRSS", "cpu_s", "loadavg", "measure", "result_row", "rss_bytes"]

# The process tree is sampled this often for peak RSS.
RSS_SAMPLE_S = 0.02
# /proc/self/status reports memory in kB (kibibytes)
_KIB = 1024


def _proc_children(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc`` (Linux; empty where unavailable)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _proc_rss(pid: int) -> int:
    """Resident bytes of ``pid`` from ``/proc/<pid>/statm`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class PeakRSS:
    """Samples the RSS of this process and all its descendants; keeps the peak (bytes).

    The sum counts pages shared between processes once per process (an
    upper bound on the tree's footprint), as ``ps`` would. Descendants of an
    excluded pid (an emulator this process started) are left out. Reads
    ``/proc`` directly (Linux), so it needs no extra package.
    """

    def __init__(self, interval_s: float = RSS_SAMPLE_S, exclude_pids: Sequence[int] = ()) -> None:
        self.interval_s = interval_s
        self._exclude = set(exclude_pids)
        self.peak = 0
        self.base = _proc_rss(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def tree(self) -> list[int]:
        """This process and its descendants, minus excluded subtrees."""
        pids, todo = [], [os.getpid()]
        while todo:
            pid = todo.pop()
            if pid in self._exclude:
                continue
            pids.append(pid)
            todo += _proc_children(pid)
        return pids

    def sample(self) -> int:
        total = sum(_proc_rss(pid) for pid in self.tree())
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakRSS:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass
class Measurement:
    """What one loader run delivered, before the parent adds the server's counters."""

    samples: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    ttfb_s: float = float("nan")
    iter_s: float = 0.0  # when the loader was built and iterating (setup done)
    last_s: float = 0.0  # when the last batch arrived
    steady_samples: int = 0
    steady_s: float = 0.0
    consumed: list[np.ndarray] = field(default_factory=list)
    complete: bool = False

    def indices(self) -> np.ndarray:
        return np.concatenate(self.consumed) if self.consumed else np.empty(0, dtype=np.int64)


def measure(
    start: Callable[[], Iterator[Any]],
    indices_of: Callable[[Any], np.ndarray],
    *,
    window_s: float,
    round_batches: int = 1,
    max_batches: int | None = None,
) -> Measurement:
    """Time a loader: ``start()`` builds it (clock running) and returns its batch iterator.

    The run ends at the end of the epoch, after ``max_batches``, or once
    ``window_s`` has passed since the first batch — checked only when a whole
    number of ``round_batches`` followed the first batch, because ``W``
    workers deliver their batches in bursts of ``W`` and a cut inside a burst
    would overstate the rate.
    """
    m = Measurement()
    t0 = time.perf_counter()
    it = start()
    m.iter_s = time.perf_counter() - t0
    t_first = None
    try:
        for batch in it:
            now = time.perf_counter()
            idx = np.asarray(indices_of(batch), dtype=np.int64)
            m.consumed.append(idx)
            m.samples += len(idx)
            m.batches += 1
            m.last_s = now - t0
            if t_first is None:
                t_first = now
                m.ttfb_s = now - t0
                first_samples = len(idx)
            else:
                m.steady_samples = m.samples - first_samples
                m.steady_s = now - t_first
            after_first = m.batches - 1
            if max_batches is not None and m.batches >= max_batches:
                break
            if after_first > 0 and after_first % round_batches == 0 and now - t_first >= window_s:
                break
        else:
            m.complete = True
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it
    m.elapsed_s = time.perf_counter() - t0
    return m


def cpu_s() -> float:
    """This process's CPU seconds so far: every thread's, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_bytes(field_name: str = "VmRSS") -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (the peak) of this process, in bytes; 0 off Linux.

    ``VmHWM`` is this process's own high-water mark, which starts afresh at
    ``exec``: nothing of the parent that started a child counts.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * _KIB
    except OSError:
        pass
    return 0


def loadavg() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (empty off Linux): how busy the box was."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return []


def result_row(cfg: dict[str, Any], m: Measurement, geoms: dict[str, Any]) -> dict[str, Any]:
    nbytes = sample_nbytes(geoms)
    steady = m.steady_samples / m.steady_s if m.steady_s > 0 else float("nan")
    pass_rate = m.samples / (m.last_s - m.iter_s) if m.last_s > m.iter_s else float("nan")
    # the rate the report compares: worker baselines from their first batch on
    # (start-up excluded, in their favour); insitubatch over its whole pass
    # from iter() (the pipeline fill included, against it)
    insitu = cfg["loader"].startswith("insitu")
    rate = pass_rate if insitu else steady
    indices = m.indices()
    return {
        "name": cfg["name"],
        "loader": cfg["loader"],
        "samples": m.samples,
        "batches": m.batches,
        "complete_epoch": m.complete,
        "elapsed_s": m.elapsed_s,
        "ttfb_s": m.ttfb_s,
        "samples_per_s": m.samples / m.elapsed_s if m.elapsed_s > 0 else float("nan"),
        "steady_samples_per_s": steady,
        "pass_samples_per_s": pass_rate,
        "rate_samples_per_s": rate,
        "rate_basis": "pass from iter()" if insitu else "steady from the first batch",
        "mb_per_s": rate * nbytes / MB,
        "min_gets": min_gets(indices, geoms),
        "distinct_samples": int(len(np.unique(indices))),
        "sample_nbytes": nbytes,
    }
