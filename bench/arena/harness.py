"""Steady-state timing of one loader in its child process: passes back to back, a warm-up, then a timed window.

Every arena loader (ours, the reference, TensorStore) is timed by
:func:`steady` with the same rules, and its memory and CPU read the same
way, with the bench's process probes (:func:`bench.measure.cpu_s`, every
thread's CPU seconds; :func:`bench.measure.rss_bytes`, ``VmRSS`` and
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

__all__ = ["Window", "steady", "timing", "train_digest"]


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
