"""Timing one loader in its child process: in steady state (passes back to back, a warm-up, then a timed
window), or over one cold pass (the open included).

Every arena loader (ours, the reference, TensorStore) is timed by
:func:`steady` or :func:`cold` (the child config's ``mode``,
:func:`time_passes`) with the same rules, and its memory and CPU read the
same way, with the bench's process probes (:func:`bench.measure.cpu_s`,
every thread's CPU seconds; :func:`bench.measure.rss_bytes`, ``VmRSS`` and
``VmHWM`` from ``/proc/self/status``).

Standard library and numpy only: the reference's child imports this from
its own virtual environment.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..measure import cpu_s

__all__ = ["ColdPass", "Window", "cold", "start", "steady", "time_passes", "timing", "train_digest"]

# The parts of a cold pass its samples/s are also given for (the ramp: the first tenth against the last).
COLD_PARTS = 10


def train_digest(indices: Any) -> str:
    """A short digest of a split's sample indices, sorted: two loaders with one digest read the same samples."""
    data = np.sort(np.asarray(indices, dtype="<i8")).tobytes()
    return hashlib.sha1(data).hexdigest()[:12]


def timing(cfg: dict[str, Any]) -> dict[str, Any]:
    """A child config's timing fields (``ArenaProfile.child_config``) as :func:`steady`'s keywords."""
    return {
        "warmup_passes": int(cfg["warmup_passes"]),
        "warmup_s": float(cfg["warmup_s"]),
        "warmup_max_s": float(cfg["warmup_max_s"]),
        "window_s": float(cfg["window_s"]),
    }


@dataclass
class Window:
    """What the timed window of :func:`steady` saw."""

    samples: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    warmup_s: float = 0.0
    warmup_samples: int = 0
    warmup_passes: int = 0  # passes finished before the window opened
    passes: int = 0  # passes opened in all, the warm-up's included
    # what close_pass returned for every pass, with "timed": whether the window saw any of it
    pass_stats: list[dict[str, Any]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The window as a result row's fields: samples/s and CPU seconds per sample."""
        out = asdict(self)
        out["rate_samples_per_s"] = self.samples / self.seconds if self.seconds > 0 else None
        out["cpu_s_per_sample"] = self.cpu_s / self.samples if self.samples else None
        return out


def steady(
    open_pass: Callable[[int], Iterator[Any]],
    size: Callable[[Any], int],
    *,
    warmup_passes: int,
    warmup_s: float,
    warmup_max_s: float,
    window_s: float,
    close_pass: Callable[[Iterator[Any]], dict[str, Any] | None] | None = None,
) -> Window:
    """Run passes ``open_pass(0)``, ``open_pass(1)``, ... back to back and time a window after a warm-up.

    The warm-up lasts ``warmup_passes`` whole passes and at least
    ``warmup_s`` seconds, but never past ``warmup_max_s`` (a slow loader is
    then timed from there); the window opens when it ends (at a pass's end,
    or when a batch arrives) and closes at the first batch ``window_s``
    seconds later. Samples/s and CPU are those of the batches that arrived
    inside the window, pass boundaries included (an epoch's restart is part
    of training). ``close_pass(iterator)`` ends a pass, also one cut short,
    and may return its statistics (a dict), kept with whether the window saw the pass.
    """
    w = Window()
    t_start = time.perf_counter()
    t0: float | None = None
    cpu0 = 0.0

    def ready(now: float) -> bool:
        elapsed = now - t_start
        return (w.warmup_passes >= warmup_passes and elapsed >= warmup_s) or elapsed >= warmup_max_s

    def open_window(now: float) -> None:
        nonlocal t0, cpu0
        t0, cpu0 = now, cpu_s()
        w.warmup_s = now - t_start

    done = False
    while not done:
        it = open_pass(w.passes)
        w.passes += 1
        timed = t0 is not None
        try:
            for batch in it:
                n = size(batch)
                now = time.perf_counter()
                if t0 is None:
                    w.warmup_samples += n
                    if ready(now):  # this batch closes the warm-up; the window counts from the next one
                        open_window(now)
                        timed = True
                    continue
                w.samples += n
                w.seconds = now - t0
                if w.seconds >= window_s:
                    w.cpu_s = cpu_s() - cpu0  # before the cut pass is closed: shutting down is not steady work
                    done = True
                    break
        finally:
            stats = close_pass(it) if close_pass is not None else None
        if stats is not None:
            w.pass_stats.append({**stats, "timed": timed})
        if t0 is None:  # a warm-up pass ended: the window may open here, before the next pass starts
            w.warmup_passes += 1
            now = time.perf_counter()
            if ready(now):
                open_window(now)
    return w


def start() -> tuple[float, float]:
    """The wall clock and this process's CPU seconds now: a cold pass's start, taken before the loader opens."""
    return time.perf_counter(), cpu_s()


@dataclass
class ColdPass:
    """What :func:`cold` saw: one whole pass of a loader opened in a fresh process, the open included."""

    samples: int = 0
    seconds: float = 0.0  # from before the open to the last batch
    cpu_s: float = 0.0  # over the same span, every thread's
    open_s: float = 0.0  # from before the open to the pass's iterator (the loader built, nothing read)
    first_batch_s: float | None = None  # from before the open to the first batch
    half_s: float | None = None  # from before the open to the batch that completed half the pass's samples
    half_samples: int = 0  # the samples up to that batch
    # per tenth of the pass's samples: when it ended (from before the open), its samples/s, and the loader's probe then
    parts: list[dict[str, Any]] = field(default_factory=list)
    first_probe: dict[str, Any] = field(default_factory=dict)  # the loader's probe at the first batch
    pass_stats: list[dict[str, Any]] = field(default_factory=list)  # what close_pass returned, "timed": True

    def row(self) -> dict[str, Any]:
        """The pass as a result row's fields: whole-pass samples/s, CPU per sample, and its two halves' rates."""
        out = asdict(self)
        out["rate_samples_per_s"] = self.samples / self.seconds if self.seconds > 0 else None
        out["cpu_s_per_sample"] = self.cpu_s / self.samples if self.samples else None
        first = second = None
        if self.half_s is not None and self.half_s > self.open_s:  # the first half from the pass's start: its fill
            first = self.half_samples / (self.half_s - self.open_s)
            if self.seconds > self.half_s:
                second = (self.samples - self.half_samples) / (self.seconds - self.half_s)
        out["first_half_samples_per_s"], out["second_half_samples_per_s"] = first, second
        return out


def cold(
    started: tuple[float, float],
    open_pass: Callable[[int], Iterator[Any]],
    size: Callable[[Any], int],
    *,
    samples: int,
    close_pass: Callable[[Iterator[Any]], dict[str, Any] | None] | None = None,
    probe: Callable[[Iterator[Any]], dict[str, Any]] | None = None,
) -> ColdPass:
    """Time one whole pass ``open_pass(0)`` from ``started`` (:func:`start`, taken before the loader opened).

    ``samples`` is the pass's expected length: at each tenth of it the
    samples/s of that tenth is kept, with ``probe(iterator)`` (the loader's
    own view then: its reads in flight, say), which is also asked at the first batch. The clock and the CPU stop at
    the last batch, before ``close_pass(iterator)``, whose statistics are kept.
    """
    t_start, cpu0 = started
    p = ColdPass()
    it = open_pass(0)
    p.open_s = time.perf_counter() - t_start
    edges = [samples * (k + 1) / COLD_PARTS for k in range(COLD_PARTS)]
    t_part, n_part = p.open_s, 0
    try:
        for batch in it:
            p.samples += size(batch)
            now = time.perf_counter() - t_start
            if p.first_batch_s is None:
                p.first_batch_s = now
                p.first_probe = probe(it) if probe is not None else {}
            if p.half_s is None and 2 * p.samples >= samples:
                p.half_s, p.half_samples = now, p.samples
            while len(p.parts) < COLD_PARTS and p.samples >= edges[len(p.parts)]:
                part = {"end_s": now, "samples_per_s": (p.samples - n_part) / (now - t_part) if now > t_part else None}
                p.parts.append({**part, **(probe(it) if probe is not None else {})})
                t_part, n_part = now, p.samples
        p.seconds = time.perf_counter() - t_start
        p.cpu_s = cpu_s() - cpu0
    finally:
        stats = close_pass(it) if close_pass is not None else None
    if stats is not None:
        p.pass_stats.append({**stats, "timed": True})
    return p


def time_passes(
    cfg: dict[str, Any],
    started: tuple[float, float],
    open_pass: Callable[[int], Iterator[Any]],
    size: Callable[[Any], int],
    *,
    samples: int,
    close_pass: Callable[[Iterator[Any]], dict[str, Any] | None] | None = None,
    probe: Callable[[Iterator[Any]], dict[str, Any]] | None = None,
) -> Window | ColdPass:
    """The timing ``cfg['mode']`` asks for: ``"cold"``, one pass from ``started``; else (``"steady"``) :func:`steady`."""
    mode = cfg.get("mode", "steady")
    if mode == "cold":
        return cold(started, open_pass, size, samples=samples, close_pass=close_pass, probe=probe)
    if mode != "steady":
        raise ValueError(f"mode={mode!r} must be 'steady' or 'cold'")
    return steady(open_pass, size, close_pass=close_pass, **timing(cfg))
