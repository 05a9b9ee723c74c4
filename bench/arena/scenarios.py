"""What the arena measures: its dataset, its links (scenarios), and how long each loader is timed (profiles).

The data is ERA5-shaped (issue 38): the generator's realistic preset
(:func:`insitubatch.testing.data.era5_181x360`), four float32 variables on
the 0.25°-grid stand-in of 181 × 360, chunks of 8 steps × 91 × 180 (four
stored tiles per chunk and variable), blosc-zstd, and 4,096 steps, so the
0.8/0.1/0.1 split by chunk gives 3,280 training samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from insitubatch.testing.data import ERA5_GRID, DatasetSpec, era5_181x360
from insitubatch.testing.emulator import DEFAULT_JITTER_S

from ..network import STRAGGLER_S, STRAGGLER_SHARE, TAIL_LINK
from ..rows import DEFAULT_BANDWIDTH_MB_S, MB

__all__ = ["FULL", "LOADERS", "QUICK", "SCENARIOS", "ArenaProfile", "Scenario"]

LOADERS = ("ours", "reference", "tensorstore")
QUICK_GRID = (91, 180)  # a quarter of the realistic grid, for the smoke run
# 4,096 steps = 512 chunks; split 0.8/0.1/0.1 by chunk, the train split is 410 chunks = 3,280 samples
FULL_STEPS = 4096
QUICK_STEPS = 256
HTTP30_LATENCY_S = 0.030


@dataclass(frozen=True)
class Scenario:
    """One link: how the data is reached (``file``, ``http`` or ``s3``) and the emulator's settings."""

    name: str
    kind: str
    link: dict[str, Any] = field(default_factory=dict)
    what: str = ""

    @property
    def remote(self) -> bool:
        return self.kind != "file"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("local", "file", what="local files"),
        Scenario("http0", "http", {"latency_s": 0.0, "jitter_s": 0.0}, "HTTP at 0 ms"),
        Scenario(
            "http30", "http", {"latency_s": HTTP30_LATENCY_S, "jitter_s": DEFAULT_JITTER_S}, "HTTP at 30 ms + jitter"
        ),
        Scenario(
            "tail40",
            "http",
            {**TAIL_LINK, "bandwidth_bytes_per_s": DEFAULT_BANDWIDTH_MB_S * MB},
            "40 ms + exponential tail (mean 20 ms) + 100 MB/s per connection",
        ),
        Scenario(
            "stragglers",
            "http",
            {**TAIL_LINK, "tail_s": 0.0, "straggler_share": STRAGGLER_SHARE, "straggler_s": STRAGGLER_S},
            "40 ms, 1% of answers 2 s late",
        ),
        Scenario("s3", "s3", {"latency_s": 0.0, "jitter_s": 0.0}, "the S3 protocol at 0 ms"),
    )
}


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
