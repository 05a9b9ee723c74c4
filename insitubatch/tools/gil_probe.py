"""The GIL probe: how many threads running a chunk transform make progress in parallel.

A transform runs on the decode pool, where one that holds the GIL serializes
every decode thread; ``insitubatch-check-transform`` runs this probe on a real
chunk (:mod:`insitubatch.tools.check_transform`).

The transform runs in ``threads`` threads at once (default 4) for a fixed
window, on a copy of the chunk cut or repeated along the sample axis so one
call takes a few milliseconds (enough work to time, short enough that the
window holds many calls). On Linux each thread reads its own CPU clock and
its scheduler accounting (``/proc/thread-self/schedstat``: time waiting for
a CPU) and the probe computes the *effective parallelism*

    P = sum over threads of  cpu_time / (wall_time - runqueue_wait)

— how many threads made progress in parallel whenever they had a core. It
is not how many CPUs were busy (that is at most the machine's CPUs): waiting
for a core is excluded, so a busy or small machine (2 cores, 4 threads) does
not lower P, and 4 threads on 2 cores can measure P close to 4; waiting for
the GIL is a sleep and is not excluded. The check's line says so, with the
machine's CPU count beside it. A transform that releases the GIL measures P close to N; one that
holds it measures P close to 1 however many cores there are. The probe
flags ``P < 1 + 0.3 * (N - 1)`` (1.9 of 4 threads): less than 30% of the
parallelism a GIL-free transform adds. Where the accounting is unavailable
it falls back to wall-clock throughput of N threads over one thread, with N
capped at the usable cores (and skips on one core).

Each thread's clock readings bracket its accounting readings, so its CPU
time and its wait both lie inside its wall time and ``cpu_time / (wall_time -
runqueue_wait)`` cannot pass 1 while the kernel's accounting agrees with the
clocks. A trial where it does pass 1 (by more than clock granularity) shows
accounting that cannot be trusted here, as some sandboxes and virtual
kernels keep it; the probe then measures by wall-clock throughput instead.

Up to five trials run; the first that clears the threshold ends the probe.
Disturbance only ever lowers a trial — on a loaded machine, a thread
preempted during the moment it holds the GIL (numpy's per-call overhead)
keeps the others waiting — while a GIL-holding transform does not reach the
threshold in any trial. Measured on a 2-core box (4 threads): per-element
Python 1.0-1.3 idle and 0.3-0.4 under a load of 9; numpy transforms 3.6-4.0
idle and 1.8-3.9 per trial under that load.

The probe counts calling threads that compute. A transform that *waits* —
on I/O, a sleep, a GPU, or a thread pool of its own (multithreaded BLAS) —
reads as serialized as well; such work rarely belongs on the decode pool,
and ``--no-gil-probe`` skips the measurement.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..transforms import DecodedChunk

__all__ = ["PROBE_THREADS", "ProbeResult", "flag_threshold", "gil_probe"]

# Threads run at once; more than the cores is fine: waiting for a core is excluded.
PROBE_THREADS = 4
# Flag when effective parallelism < 1 + GIL_MARGIN * (threads - 1).
GIL_MARGIN = 0.3
# One call should take between these: well above per-call Python overhead (~10-50 us),
# and well below the window, so the ragged end of the window is a small part of it.
PROBE_MIN_CALL_S = 0.002
PROBE_MAX_CALL_S = 0.025
# A chunk outside that range is resized to aim here, in up to this many steps.
PROBE_TARGET_CALL_S = 0.005
PROBE_RESIZE_STEPS = 3
# A call's time is the best of this many (the first pays one-time costs, any may be preempted).
PROBE_CALIBRATION_CALLS = 3
# How long the threads run together, at least, and in calls, at least.
PROBE_WINDOW_S = 0.25
PROBE_WINDOW_CALLS = 10
# Measurements at most; the best is kept, and the first that clears the threshold ends the probe.
PROBE_TRIALS = 5
# A chunk is repeated along the sample axis up to this many bytes to make a call long enough.
PROBE_MAX_BYTES = 64_000_000
# Kernel per-thread scheduler accounting: "<ns on cpu> <ns waiting on a runqueue> <timeslices>".
SCHEDSTAT_PATH = "/proc/thread-self/schedstat"
NS_PER_S = 1e9
# CPU burnt to see whether that accounting moves at all.
SCHEDSTAT_CHECK_S = 0.005
# A thread may show this much more CPU than its unwaited wall time (clock granularity) before the
# accounting is taken as contradicting the clocks.
ACCOUNTING_SLACK = 1.05
ACCOUNTING_SLACK_S = 0.002
# How parallelism was measured: per-thread scheduler accounting, or throughput of N threads over one.
ProbeMethod = Literal["schedstat", "wall-clock"]


@dataclass(frozen=True)
class ProbeResult:
    """What the GIL probe measured: ``parallelism`` of ``threads``, and the flag threshold."""

    method: ProbeMethod
    threads: int
    parallelism: float
    threshold: float
    samples: int
    call_s: float
    cpus: int = 1  # usable CPUs of the machine: at most this many threads ran at any instant

    def describe(self) -> str:
        """What was measured, in words that hold on a machine with fewer CPUs than threads."""
        if self.method == "schedstat":
            return (
                f"{self.parallelism:.2f} of {self.threads} threads progressed in parallel whenever they had a CPU "
                f"(time waiting for one of this machine's {self.cpus} CPUs excluded)"
            )
        return f"{self.threads} threads did {self.parallelism:.2f}x the work of one ({self.cpus} CPUs)"

    @property
    def holds_gil(self) -> bool:
        return self.parallelism < self.threshold


def flag_threshold(threads: int) -> float:
    """Parallelism below which ``threads`` threads are flagged as held back by the GIL."""
    return 1.0 + GIL_MARGIN * (threads - 1)


def _schedstat() -> tuple[float, float] | None:
    """This thread's seconds on a CPU and waiting for one, or ``None`` where the kernel does not say."""
    try:
        with open(SCHEDSTAT_PATH) as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu) / NS_PER_S, int(waiting) / NS_PER_S
    except (OSError, ValueError):
        return None


def _schedstat_live() -> bool:
    """Whether this thread's accounting exists and moves while it computes (not every kernel keeps it)."""
    before = _schedstat()
    if before is None:
        return False
    deadline = time.perf_counter() + SCHEDSTAT_CHECK_S
    while time.perf_counter() < deadline:  # burn a little CPU in this thread
        pass
    after = _schedstat()
    return after is not None and after[0] > before[0]


@dataclass
class _ThreadRun:
    wall: float = 0.0
    calls: int = 0
    on_cpu: float | None = None
    waiting: float | None = None
    error: BaseException | None = None


def _run_together(call: Callable[[], object], threads: int, window_s: float) -> list[_ThreadRun]:
    """Run ``call`` in ``threads`` threads, all started together, for ``window_s``; per-thread accounting."""
    runs = [_ThreadRun() for _ in range(threads)]
    ready = threading.Barrier(threads + 1)
    stop = threading.Event()

    def body(run: _ThreadRun) -> None:
        try:
            call()  # first-call costs (caches, lazy imports) stay out of the window
        except BaseException as exc:  # reported as a failed check, never lost in a thread
            run.error = exc
        ready.wait()
        if run.error is not None:
            return
        # wall clock outside, accounting inside, CPU clock innermost: each lies within the one around it
        t0 = time.perf_counter()
        start = _schedstat()
        cpu0 = time.thread_time()
        try:
            while not stop.is_set():
                call()
                run.calls += 1
        except BaseException as exc:
            run.error = exc
        cpu1 = time.thread_time()
        end = _schedstat()
        run.wall = time.perf_counter() - t0
        if start is not None and end is not None:
            run.on_cpu, run.waiting = cpu1 - cpu0, end[1] - start[1]

    workers = [threading.Thread(target=body, args=(r,), name=f"gil-probe-{i}", daemon=True) for i, r in enumerate(runs)]
    for w in workers:
        w.start()
    ready.wait()
    time.sleep(window_s)
    stop.set()
    for w in workers:
        w.join()
    return runs


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _probe_input(transform: Callable[[DecodedChunk], object], chunk: DecodedChunk) -> tuple[DecodedChunk, float]:
    """``chunk`` cut or repeated along the sample axis so one call takes about ``PROBE_TARGET_CALL_S``."""

    def call_time(c: DecodedChunk) -> float:
        # best of a few calls: the first pays one-time costs, any may be preempted
        best = math.inf
        for _ in range(PROBE_CALIBRATION_CALLS):
            t0 = time.perf_counter()
            try:
                transform(DecodedChunk(c.read, c.data, c.sample_offset))  # fresh: a transform may rebind .data
            except Exception as exc:  # the user's transform, on a resized chunk
                raise RuntimeError(f"the transform raised on a {c.data.shape[0]}-sample probe chunk: {exc!r}") from exc
            best = min(best, time.perf_counter() - t0)
            if best > PROBE_MAX_CALL_S:
                break
        return best

    probe, call_s = chunk, call_time(chunk)
    for _ in range(PROBE_RESIZE_STEPS):
        data = probe.data
        if call_s > PROBE_MAX_CALL_S and data.shape[0] > 1:
            data = data[: max(1, int(data.shape[0] * PROBE_TARGET_CALL_S / call_s))]
        elif call_s < PROBE_MIN_CALL_S and 0 < 2 * data.nbytes <= PROBE_MAX_BYTES:
            wanted = math.ceil(PROBE_TARGET_CALL_S / call_s) if call_s > 0 else PROBE_MAX_BYTES
            data = np.concatenate([data] * max(2, min(wanted, PROBE_MAX_BYTES // data.nbytes)), axis=0)
        else:
            break
        data = np.ascontiguousarray(data)
        probe = DecodedChunk(chunk.read, data, chunk.sample_offset)
        call_s = call_time(probe)
    return probe, call_s


def gil_probe(
    transform: Callable[[DecodedChunk], object],
    chunk: DecodedChunk,
    *,
    threads: int = PROBE_THREADS,
    window_s: float = PROBE_WINDOW_S,
    trials: int = PROBE_TRIALS,
) -> ProbeResult | None:
    """Measure how many threads running ``transform`` progress in parallel (see the module docstring).

    Returns ``None`` when nothing can be concluded: no scheduler accounting
    and fewer than two usable cores, or threads that never got a core.

    Raises
    ------
    RuntimeError
        The transform raised in a probe thread (it may not be thread-safe),
        or on the probe's chunk, cut or repeated along the sample axis.
    """
    if threads < 2:
        raise ValueError(f"{threads=} must be >= 2 for a thread-scaling probe")
    probe_chunk, call_s = _probe_input(transform, chunk)
    window_s = max(window_s, PROBE_WINDOW_CALLS * call_s)

    def call() -> object:
        return transform(DecodedChunk(probe_chunk.read, probe_chunk.data, probe_chunk.sample_offset))

    def raise_errors(runs: list[_ThreadRun]) -> None:
        for r in runs:
            if r.error is not None:
                raise RuntimeError(f"the transform raised in a probe thread: {r.error!r}") from r.error

    def by_accounting() -> float | None:
        """Effective parallelism of one trial; ``None`` where the accounting contradicts the clocks."""
        runs = _run_together(call, threads, window_s)
        raise_errors(runs)
        seen = [(r.on_cpu, r.wall - r.waiting) for r in runs if r.on_cpu is not None and r.waiting is not None]
        if any(cpu > active * ACCOUNTING_SLACK + ACCOUNTING_SLACK_S for cpu, active in seen):
            return None
        # a thread that spent (nearly) the whole window waiting for a core says nothing
        seen = [(cpu, active) for cpu, active in seen if active > PROBE_MIN_CALL_S]
        return threads * sum(cpu / active for cpu, active in seen) / len(seen) if len(seen) >= 2 else -math.inf

    def by_throughput(n: int) -> float:
        """Work of ``n`` threads over the work of one, in one trial."""
        single = _run_together(call, 1, window_s)
        many = _run_together(call, n, window_s)
        raise_errors(single + many)
        rate_1 = single[0].calls / single[0].wall
        return sum(r.calls / r.wall for r in many) / rate_1 if rate_1 > 0 else -math.inf

    method: ProbeMethod = "schedstat" if _schedstat_live() else "wall-clock"
    n = threads if method == "schedstat" else min(threads, _usable_cpus())
    if n < 2:
        return None
    best = -math.inf
    for _ in range(trials):
        measured = by_accounting() if method == "schedstat" else by_throughput(n)
        if measured is None:  # accounting not to be trusted here: measure throughput from the start
            method, n, best = "wall-clock", min(threads, _usable_cpus()), -math.inf
            if n < 2:
                return None
            measured = by_throughput(n)
        best = max(best, measured)
        if best >= flag_threshold(n):  # disturbance only lowers a trial: one clear pass settles it
            break
    if best == -math.inf:
        return None
    threshold = flag_threshold(n)
    return ProbeResult(method, n, best, threshold, probe_chunk.data.shape[0], call_s, _usable_cpus())
