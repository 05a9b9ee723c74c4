"""Time a user's loader configuration against the raw-GET ceiling of the same store, in the same run.

:func:`measure_loader` builds the dataset with the caller's own function
(``make_dataset()``, every knob theirs), times a *cold* pass of one split
(a fresh dataset: empty pool), then a *warm* pass (the same split again on
that dataset: the pool, or a persisted disk cache, may serve it), and
replays the cold pass's GETs through the store's client at the concurrency
the pass had (its ``max_inflight``; under ``"auto"`` its peak of GETs in
flight: :func:`replay_concurrency`) with nothing else to do: the raw-GET ceiling
(:func:`~insitubatch.testing.ceiling.raw_get_ceiling`). Its result,
:class:`LoaderBenchmark`, holds samples/s, GETs and bytes as the server
counted them, the pool's peak resident bytes, and ``ratio``: cold samples/s
over the ceiling's samples/s. A gate on ``ratio`` holds on any machine.

The pytest plugin's ``loader_benchmark`` fixture runs this under
pytest-benchmark; it needs nothing of pytest itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .ceiling import GetCeiling, raw_get_ceiling
from .served import ServedZarr

__all__ = ["LoaderBenchmark", "PassReport", "measure_loader", "replay_concurrency"]

# Replays of the ceiling; the fastest counts (a ceiling is the best the link did).
CEILING_ROUNDS = 3
# ``run_rounds(setup, target, rounds)``: calls ``setup()`` then ``target(*args)`` per round (pytest-benchmark's
# ``pedantic`` fits, and may run fewer rounds, e.g. once when disabled).
RoundRunner = Callable[[Callable[[], Any], Callable[..., None], int], Any]


@dataclass(frozen=True)
class PassReport:
    """One timed pass: what it delivered, what the server saw, the pool's peak, and the stage that limited it."""

    samples: int
    batches: int
    seconds: float
    gets: int  # chunk and metadata GETs the server answered during the pass
    bytes: int  # body bytes the server sent
    peak_resident_bytes: int  # the pool's peak (decoded tiles held), since the dataset was built
    limiting_stage: str
    advice: str
    max_inflight: int = 0  # the most reads in flight it allowed (under "auto": the highest limit chosen)
    inflight_auto: bool = False  # max_inflight was "auto"
    inflight_peak: int = 0  # the most GETs it really had in flight at once

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_s": self.samples_per_s}


@dataclass(frozen=True)
class LoaderBenchmark:
    """A cold pass, a warm pass (or None) and the raw-GET ceiling of the cold pass's GETs."""

    split: str
    cold: PassReport
    warm: PassReport | None
    ceiling: GetCeiling
    cold_rounds_s: tuple[float, ...] = field(default=())

    @property
    def ceiling_samples_per_s(self) -> float:
        """The samples/s the raw GETs alone deliver: the cold pass's samples over the replay's time."""
        return self.ceiling.samples_per_s(self.cold.samples)

    @property
    def ratio(self) -> float:
        """Cold samples/s over the ceiling's: 1.0 is as fast as the store hands out the bytes."""
        ceiling = self.ceiling_samples_per_s
        return self.cold.samples_per_s / ceiling if ceiling > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON-able: what goes into pytest-benchmark's ``extra_info``."""
        out: dict[str, Any] = {"split": self.split, "ratio": self.ratio}
        out["ceiling_samples_per_s"] = self.ceiling_samples_per_s
        for name, report in (("cold", self.cold), ("warm", self.warm)):
            if report is not None:
                out.update({f"{name}_{k}": v for k, v in report.to_dict().items()})
        out.update({f"ceiling_{k}": v for k, v in self.ceiling.to_dict().items()})
        return out

    def summary(self) -> str:
        """A few lines to print or to put in an assertion message."""
        lines = []
        for name, r in (("cold", self.cold), ("warm", self.warm)):
            if r is not None:
                lines.append(
                    f"{name:<8} {r.samples_per_s:>10.0f} samples/s  {r.gets:>6} GETs {r.bytes / 1e6:>8.2f} MB  "
                    f"peak resident {r.peak_resident_bytes / 1e6:.1f} MB  limited by {r.limiting_stage}"
                )
        c = self.ceiling
        why = (
            "the cold pass's peak of GETs in flight under max_inflight='auto'"
            if self.cold.inflight_auto and self.cold.inflight_peak
            else "the cold pass's max_inflight"
        )
        lines.append(
            f"ceiling  {self.ceiling_samples_per_s:>10.0f} samples/s  {c.gets:>6} GETs {c.nbytes / 1e6:>8.2f} MB  "
            f"at concurrency {c.concurrency} ({why}), {c.seconds:.3f} s"
        )
        lines.append(f"ratio    {self.ratio:.2f} of the raw-GET ceiling")
        return "\n".join(lines)


def replay_concurrency(cold: PassReport) -> int:
    """GETs the ceiling's replay keeps in flight: what the loader had.

    A pinned ``max_inflight`` is what it allowed; under ``"auto"`` it is the
    pass's real peak of GETs in flight, not the controller's highest limit,
    which a pass that never needed it never filled (a sound configuration
    would read as a fraction of a ceiling it was never offered).
    """
    if cold.inflight_auto and cold.inflight_peak:
        return cold.inflight_peak
    return max(1, cold.max_inflight)


def _one_by_one(setup: Callable[[], Any], target: Callable[..., None], rounds: int) -> None:
    for _ in range(rounds):
        args, kwargs = setup()
        target(*args, **kwargs)


def _timed_pass(ds: Any, split: str, served: ServedZarr) -> tuple[PassReport, Any]:
    """Iterate ``split`` of ``ds`` once; the report, and the server's counters of the pass."""
    served.reset_stats()
    t0 = time.perf_counter()
    it = iter(ds.split(split))
    batches = samples = 0
    for batch in it:
        batches += 1
        samples += len(batch)
    seconds = time.perf_counter() - t0
    stats, server = it.stats, served.stats()
    report = PassReport(
        samples=samples,
        batches=batches,
        seconds=seconds,
        gets=server.gets,
        bytes=server.bytes_sent,
        peak_resident_bytes=int(ds.pool.totals.peak_resident_bytes),
        limiting_stage=stats.limiting_stage,
        advice=stats.advice,
        max_inflight=int(stats.inflight_max if stats.inflight_auto else stats.max_inflight),
        inflight_auto=bool(stats.inflight_auto),
        inflight_peak=int(stats.inflight_peak),
    )
    return report, server


def measure_loader(
    served: ServedZarr,
    make_dataset: Callable[[], Any],
    *,
    split: str = "train",
    rounds: int = 1,
    warm: bool = True,
    ceiling_rounds: int = CEILING_ROUNDS,
    run_rounds: RoundRunner | None = None,
) -> LoaderBenchmark:
    """Cold and warm passes of ``make_dataset()``'s ``split`` against the raw-GET ceiling (module docstring).

    Parameters
    ----------
    served
        The store the dataset reads, behind the emulator (``serve_zarr`` or
        the ``zarr_emulator`` fixture): its counters are the GETs, its URL
        the ceiling's client.
    make_dataset
        Builds the ``InSituDataset`` to measure (called once per cold round).
    split
        The split to iterate.
    rounds
        Cold passes, each on a fresh dataset; the median counts.
    warm
        Also time a second pass of the split on the last dataset.
    ceiling_rounds
        Replays of the ceiling; the fastest counts.
    run_rounds
        Runs the cold rounds (pytest-benchmark's ``pedantic`` under the plugin).

    Raises
    ------
    ValueError
        The cold pass yielded no sample or issued no chunk GET (nothing to compare).
    """
    built: list[Any] = []
    colds: list[tuple[PassReport, Any]] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        while built:  # a round's dataset is done with once the next round starts
            built.pop().close()
        built.append(make_dataset())
        return (built[-1],), {}

    def cold(ds: Any) -> None:
        colds.append(_timed_pass(ds, split, served))

    try:
        (run_rounds or _one_by_one)(setup, cold, rounds)
        ds = built[-1]
        by_time = sorted(colds, key=lambda c: c[0].seconds)
        cold_report, cold_server = by_time[len(by_time) // 2]
        keys = served.chunk_gets(cold_server)
        if not cold_report.samples or not keys:
            raise ValueError(
                f"the cold pass of split {split!r} yielded {cold_report.samples} samples from {len(keys)} chunk "
                "GETs: there is no throughput to compare with the store's"
            )
        warm_report = _timed_pass(ds, split, served)[0] if warm else None
        concurrency = replay_concurrency(cold_report)
    finally:
        while built:
            built.pop().close()
    from ..stores.owned import close_store

    store = served.store()
    try:
        replays = [raw_get_ceiling(store, keys, concurrency) for _ in range(max(1, ceiling_rounds))]
    finally:
        close_store(store)
    return LoaderBenchmark(
        split=split,
        cold=cold_report,
        warm=warm_report,
        ceiling=min(replays, key=lambda c: c.seconds),
        cold_rounds_s=tuple(c[0].seconds for c in colds),
    )
