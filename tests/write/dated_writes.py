"""Shared pieces of the write-by-coordinate tests (no tests here).

An output group labelled by valid time: ``pred(valid_time, channel, x)`` and
``count(valid_time)`` with the same chunks and shards as ``write_helpers``
(slots align to 12), and a model whose output depends on the valid time
alone, so a test can check each stored step against the time it is stored at.
Spawned worker processes import the work function from here.
"""

from __future__ import annotations

import numpy as np

from insitubatch.write import LayoutSpec, OutputArray, SlotWriter

GROUP = "out"
EXTENT = 44
ALIGNMENT = 12
BATCH = 5  # valid times per write: divides neither chunks nor shards
TIMES = np.datetime64("2020-01-01T00", "ns") + np.arange(EXTENT) * np.timedelta64(6, "h")
X = np.linspace(0.0, 7.0, 8)


def dated_spec(times: np.ndarray = TIMES) -> LayoutSpec:
    """The output layout, its index coordinate ``valid_time`` = ``times``."""
    n = len(times)
    return LayoutSpec(
        (
            OutputArray(
                "pred",
                (n, 3, 8),
                (2, 3, 8),
                "float32",
                shards=(6, 3, 8),
                dimension_names=("valid_time", "channel", "x"),
                fill_value=float("nan"),
            ),
            OutputArray("count", (n,), (4,), "int32", dimension_names=("valid_time",)),
        ),
        coords={"valid_time": times, "x": X},
    )


def forecast(valid: np.ndarray) -> dict[str, np.ndarray]:
    """What the model predicts for valid times ``valid`` (a function of the time alone)."""
    hours = ((valid - TIMES[0]) / np.timedelta64(1, "h")).astype(np.float64)[:, None, None]
    pred = np.sin(0.05 * hours + np.arange(3)[None, :, None]) * np.cos(0.3 * X)[None, None, :]
    return {"pred": pred.astype(np.float32), "count": (hours[:, 0, 0] * 7 + 1).astype(np.int32)}


def write_by_time(writer: SlotWriter) -> int:
    """Write the writer's slot by valid time, ``BATCH`` steps per call; returns the steps written."""
    valid = writer.slot_coord
    assert valid is not None
    for k in range(0, len(valid), BATCH):
        step = valid[k : k + BATCH]
        for name, values in forecast(step).items():
            writer.write(name, at=step, data=values)
    return len(valid)
