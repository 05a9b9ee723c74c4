"""What the arena measures: its dataset, its list of the bench's scenarios, and how long each loader is timed (profiles).

The data is ERA5-shaped (issue 38): the generator's realistic preset
(:func:`insitubatch.testing.data.era5_181x360`), four float32 variables on
the 0.25°-grid stand-in of 181 × 360, chunks of 8 steps × 91 × 180 (four
stored tiles per chunk and variable), blosc-zstd, and 4,096 steps, so the
0.8/0.1/0.1 split by chunk gives 3,280 training samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from insitubatch.testing.data import ERA5_GRID, DatasetSpec, era5_181x360

from ..scenarios import HTTP0, HTTP30, LOCAL, S3, STRAGGLERS, TAIL_PACED, Scenario

__all__ = ["FULL", "LOADERS", "QUICK", "SCENARIOS", "ArenaProfile"]

LOADERS = ("ours", "reference", "tensorstore")
QUICK_GRID = (91, 180)  # a quarter of the realistic grid, for the smoke run
# 4,096 steps = 512 chunks; split 0.8/0.1/0.1 by chunk, the train split is 410 chunks = 3,280 samples
FULL_STEPS = 4096
QUICK_STEPS = 256
# The arena's links, in the order it measures them: the bench's scenarios (``bench.scenarios``), every
# loader on each.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (LOCAL, HTTP0, HTTP30, TAIL_PACED, STRAGGLERS, S3)}


@dataclass(frozen=True)
class ArenaProfile:
    """The dataset and the timing of one arena run."""

    name: str
    spec: DatasetSpec
    batch_size: int
    warmup_passes: int  # whole passes before the window (the cold start and the self-tuning settle)
    warmup_s: float  # and at least this long
    warmup_max_s: float  # but never longer: a slow loader is timed from here
    window_s: float  # the timed window (passes back to back)
    child_timeout_s: float  # a child past this is killed and its row is an error
    orders_epochs: int  # epochs of our order saved for the TensorStore loop (it wraps around past them)

    def child_config(self) -> dict[str, Any]:
        """The timing fields every loader's child config carries."""
        return {
            "batch_size": self.batch_size,
            "warmup_passes": self.warmup_passes,
            "warmup_s": self.warmup_s,
            "warmup_max_s": self.warmup_max_s,
            "window_s": self.window_s,
        }


FULL = ArenaProfile(
    "full",
    era5_181x360(FULL_STEPS, ERA5_GRID),
    batch_size=32,
    warmup_passes=1,
    warmup_s=0.0,
    warmup_max_s=45.0,
    window_s=15.0,
    child_timeout_s=300.0,
    orders_epochs=32,
)
QUICK = ArenaProfile(
    "quick",
    era5_181x360(QUICK_STEPS, QUICK_GRID),
    batch_size=32,
    warmup_passes=0,
    warmup_s=0.5,
    warmup_max_s=5.0,
    window_s=1.5,
    child_timeout_s=90.0,
    orders_epochs=32,
)
