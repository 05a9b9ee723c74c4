"""The bench's one scenario concept: a link to the data (local files, or the emulator over HTTP or S3), and the loop that serves each.

A :class:`Scenario` is data: a name, how the data is reached (``kind``),
the emulator's settings (``link``, :class:`~insitubatch.testing.emulator.EmulatorProcess`'s
keywords) and a line saying what it is. The links the bench measures on
are named here once (:data:`LOCAL`, :data:`HTTP0`, :data:`HTTP30`,
:data:`TAIL`, :data:`STRAGGLERS`, :data:`THROTTLE`, :data:`S3`), and the
scenario lists are tables of them: the arena's
(:data:`bench.arena.scenarios.SCENARIOS`, every loader on each link), the
network scenarios' (:data:`bench.network.SCENARIOS`, one measurement per
link) and the report's own link (``bench.run``, from its flags).
:func:`measure_each` is the harness both lists run through: it serves each
scenario's link from its own emulator process (the server's CPU is never
the loader's) and hands it to the list's measurement, whose children run
through :class:`bench.children.Children`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from insitubatch.testing.emulator import DEFAULT_JITTER_S, EmulatorProcess

from .rows import DEFAULT_BANDWIDTH_MB_S, MB

__all__ = [
    "HTTP0",
    "HTTP30",
    "LOCAL",
    "S3",
    "STRAGGLERS",
    "TAIL",
    "TAIL_PACED",
    "THROTTLE",
    "Scenario",
    "measure_each",
]

# The links, as object stores were measured to behave: a 40 ms floor with an exponential tail of 20 ms mean (its p99
# about 140 ms); 1% of the answers 2 s late; throttling bursts of 2 s every 6 s on 5% of the GETs.
TAIL_LATENCY_S = 0.040
TAIL_MEAN_S = 0.020
STRAGGLER_SHARE = 0.01
STRAGGLER_S = 2.0
THROTTLE_SHARE = 0.05
THROTTLE_PERIOD_S = 6.0
THROTTLE_BURST_S = 2.0
# an object store's usual time to first byte
HTTP30_LATENCY_S = 0.030
KINDS = ("file", "http", "s3")


@dataclass(frozen=True)
class Scenario:
    """One link: how the data is reached (``file``, ``http`` or ``s3``) and the emulator's settings."""

    name: str
    kind: str
    link: dict[str, Any] = field(default_factory=dict)
    what: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scenario {self.name!r}: kind={self.kind!r} must be one of {KINDS}")
        if self.kind == "file" and self.link:
            raise ValueError(f"scenario {self.name!r}: local files take no link, got {self.link}")

    @property
    def remote(self) -> bool:
        return self.kind != "file"

    def emulator(self, data: Path) -> EmulatorProcess:
        """An emulator serving ``data`` with this link (a context manager; the scenario must be remote)."""
        if not self.remote:
            raise ValueError(f"scenario {self.name!r} reads local files; it has no emulator")
        return EmulatorProcess(data, **self.link)

    @contextlib.contextmanager
    def served(self, data: Path) -> Iterator[EmulatorProcess | None]:
        """The emulator with this link while the block runs, or nothing for local files."""
        if not self.remote:
            yield None
            return
        with self.emulator(data) as emu:
            yield emu

    def location(self, data: Path, name: str, emu: EmulatorProcess | None) -> dict[str, Any]:
        """Where a child finds the group ``data / name`` in this scenario (:func:`bench.split_tiles.open_location`)."""
        local = str(data / name)
        if emu is None:
            return {"kind": "file", "path": local}
        if self.kind == "s3":
            return {"kind": "s3", "bucket": name, "endpoint": emu.url, "path": local}
        return {"kind": "http", "url": emu.url_for(name), "path": local}


TAIL_LINK: dict[str, Any] = {"latency_s": TAIL_LATENCY_S, "jitter_s": DEFAULT_JITTER_S, "tail_s": TAIL_MEAN_S}
LOCAL = Scenario("local", "file", what="local files")
HTTP0 = Scenario("http0", "http", {"latency_s": 0.0, "jitter_s": 0.0}, "HTTP at 0 ms")
HTTP30 = Scenario(
    "http30", "http", {"latency_s": HTTP30_LATENCY_S, "jitter_s": DEFAULT_JITTER_S}, "HTTP at 30 ms + jitter"
)
TAIL = Scenario("tail", "http", TAIL_LINK, "40 ms + exponential tail (mean 20 ms)")
TAIL_PACED = Scenario(
    "tail40",
    "http",
    {**TAIL_LINK, "bandwidth_bytes_per_s": DEFAULT_BANDWIDTH_MB_S * MB},
    "40 ms + exponential tail (mean 20 ms) + 100 MB/s per connection",
)
STRAGGLERS = Scenario(
    "stragglers",
    "http",
    {**TAIL_LINK, "tail_s": 0.0, "straggler_share": STRAGGLER_SHARE, "straggler_s": STRAGGLER_S},
    "40 ms, 1% of answers 2 s late",
)
THROTTLE = Scenario(
    "throttle",
    "http",
    {
        **TAIL_LINK,
        "throttle_share": THROTTLE_SHARE,
        "throttle_period_s": THROTTLE_PERIOD_S,
        "throttle_burst_s": THROTTLE_BURST_S,
    },
    "40 ms + the tail, 5% of GETs answered 503 SlowDown in 2 s bursts every 6 s",
)
S3 = Scenario("s3", "s3", {"latency_s": 0.0, "jitter_s": 0.0}, "the S3 protocol at 0 ms")


def measure_each(
    scenarios: Sequence[Scenario],
    data: Path,
    measure: Callable[[Scenario, EmulatorProcess | None], dict[str, Any]],
    *,
    label: str,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """``{name: measure(scenario, emulator)}`` for each scenario in turn, its link served from ``data`` meanwhile."""
    results: dict[str, dict[str, Any]] = {}
    for scenario in scenarios:
        log(f"{label}: {scenario.name} ({scenario.what})")
        with scenario.served(data) as emu:
            results[scenario.name] = measure(scenario, emu)
    return results
