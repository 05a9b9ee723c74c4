"""How much a report run measures: the :class:`Profile` knobs, and the :data:`FULL` and :data:`QUICK` runs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Profile"]


@dataclass(frozen=True)
class Profile:
    """How much the report measures; :data:`FULL` fits ~10 min on 2 cores, :data:`QUICK` < 60 s."""

    name: str
    n_time: int
    batch_size: int
    main_spc: int
    sweep_spcs: tuple[int, ...]
    # the worker baselines read one sample per __getitem__, so their rate is
    # flat in samples-per-chunk; they are swept at these values only
    worker_sweep_spcs: tuple[int, ...]
    # the whole loader grid runs at main_spc; at one sample per chunk only the best of each kind
    dataloader_grid: tuple[tuple[int, str | None], ...]
    xbatcher_grid: tuple[tuple[int, str | None], ...]
    xbatcher_dask: bool
    inflight: tuple[int, ...]
    window_s: float
    sweep_window_s: float
    fork_timeout_s: float
    fork_variants: tuple[str, ...]
    child_timeout_s: float
    # True: each run in a fresh child process (clean RSS and TTFB); False: in
    # this process, imports paid once (the quick smoke run; the fork probe is
    # always a child)
    isolate: bool
    # at one sample per chunk, also the warm and local-store insitubatch rows
    warm_and_local_at_1: bool
    # the main table runs insitubatch and the ceilings this often and keeps the median (noisy small boxes)
    repeats: int


FULL = Profile(
    name="full",
    n_time=2920,  # two years of 6-hourly steps
    batch_size=32,
    main_spc=8,
    sweep_spcs=(1, 2, 4, 8, 16, 32),
    worker_sweep_spcs=(1, 8, 32),
    dataloader_grid=((0, None), (2, "spawn"), (2, "forkserver"), (4, "spawn"), (4, "forkserver")),
    xbatcher_grid=((0, None), (2, "spawn")),
    xbatcher_dask=True,
    inflight=(1, 2, 4, 8, 16, 32, 64, 128),
    window_s=3.0,
    sweep_window_s=2.0,
    fork_timeout_s=8.0,
    fork_variants=("inherit", "reopen", "clean"),
    child_timeout_s=240.0,
    isolate=True,
    warm_and_local_at_1=False,
    repeats=3,
)
QUICK = Profile(
    name="quick",
    n_time=192,
    batch_size=8,
    main_spc=8,
    sweep_spcs=(1, 8),
    worker_sweep_spcs=(1, 8),
    dataloader_grid=((0, None),),
    xbatcher_grid=((0, None),),
    xbatcher_dask=False,
    inflight=(4, 32),
    window_s=0.5,
    sweep_window_s=0.5,
    fork_timeout_s=4.0,
    fork_variants=("inherit",),
    child_timeout_s=60.0,
    isolate=False,
    warm_and_local_at_1=False,
    repeats=1,
)
