"""The WeatherBench2-sized preset served by the emulator, for the WB2 examples' ``--local`` mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from insitubatch.testing.data import wb2_64x32, write_era5_like
from insitubatch.testing.emulator import EmulatorProcess

__all__ = ["local_wb2"]


@contextlib.contextmanager
def local_wb2(directory: Path, n_time: int, latency_ms: float) -> Iterator[str]:
    """Write the 64x32 preset under ``directory`` (once) and serve it; yields its URL."""
    spec = wb2_64x32(n_time)
    directory.mkdir(parents=True, exist_ok=True)
    write_era5_like(directory / spec.name, spec)
    with EmulatorProcess(directory, latency_s=latency_ms / 1e3) as emu:
        yield emu.url_for(spec.name)
