"""insitubatch's pytest plugin: pin your loader's throughput in CI as a ratio to the store's own ceiling.

Installed with insitubatch and registered through the ``pytest11`` entry
point, it only defines fixtures (and the ``insitubatch_link`` marker): it
does nothing in a test session whose tests do not ask for them.

``era5_zarr``
    A factory (session-scoped) that writes a small ERA5-like zarr group,
    once per shape, and returns its path.
``zarr_emulator``
    A factory that serves a zarr group (your path, or a generated
    ERA5-like one) through the loopback object-store emulator with the link
    settings of the test: ``latency_s``, ``jitter_s``,
    ``bandwidth_bytes_per_s``, and any other setting the emulator takes by
    name (with its link model: ``tail_s``, ``straggler_share``,
    ``straggler_s``, ``throttle_share``...). Returns a
    :class:`~insitubatch.testing.served.ServedZarr`; every server is stopped
    when the test ends. Settings given by ``@pytest.mark.insitubatch_link(...)``
    are the test's defaults.
``loader_benchmark``
    Times a cold and a warm pass of *your* ``InSituDataset`` under
    pytest-benchmark and measures the raw-GET ceiling of the same GETs in
    the same test (:func:`~insitubatch.testing.loader_bench.measure_loader`);
    returns a :class:`~insitubatch.testing.loader_bench.LoaderBenchmark`
    whose ``ratio`` a gate asserts on, and records it in the benchmark's
    ``extra_info``. Needs pytest-benchmark.

See ``docs/testing.md`` ("Pin your loader's throughput in CI").
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .loader_bench import LoaderBenchmark
    from .served import ServedZarr

# The marker whose keyword arguments are a test's default link settings.
LINK_MARKER = "insitubatch_link"
# era5_zarr's default: 512 six-hourly steps of four 32 x 64 variables, 8 steps per chunk (~16 MB, 256 chunk files).
ERA5_N_TIME = 512
ERA5_SAMPLES_PER_CHUNK = 8


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{LINK_MARKER}(**settings): link settings (latency_s, jitter_s, bandwidth_bytes_per_s, ...) that "
        "insitubatch's zarr_emulator fixture uses by default in this test",
    )


@pytest.fixture(scope="session")
def era5_zarr(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: ``era5_zarr(n_time=512, samples_per_chunk=8, **spec)`` writes (once) and returns an ERA5-like group.

    The group is WeatherBench2-sized (32 x 64, variables ``2m_temperature``,
    ``10m_u_component_of_wind``, ``10m_v_component_of_wind``,
    ``mean_sea_level_pressure``), zstd-compressed, with consolidated metadata.
    ``spec`` takes any other field of :class:`insitubatch.testing.data.DatasetSpec`
    (``inner_tiles``, ``shard_samples``, ``codec``, ``variables``, ...).
    """
    root = tmp_path_factory.mktemp("insitubatch-era5")

    def make(n_time: int = ERA5_N_TIME, *, samples_per_chunk: int = ERA5_SAMPLES_PER_CHUNK, **spec: Any) -> Path:
        from .data import wb2_64x32, write_era5_like

        dataset = wb2_64x32(n_time, samples_per_chunk=samples_per_chunk, **spec)
        return write_era5_like(root / dataset.name, dataset)  # reused when this spec was written before

    return make


@pytest.fixture
def zarr_emulator(request: pytest.FixtureRequest) -> Iterator[Callable[..., ServedZarr]]:
    """Factory: ``zarr_emulator(path=None, *, latency_s=0.03, jitter_s=0.005, bandwidth_bytes_per_s=None, process=True, **link)``.

    Serves ``path`` (default: ``era5_zarr()``) on 127.0.0.1 and returns a
    ``ServedZarr``: ``.url``, ``.store()``, ``.stats()``, ``.reset_stats()``,
    ``.configure(...)``. ``process=False`` serves from a thread of the test
    process (``.server.inject(...)`` then adds faults).
    """
    from .served import serve_zarr

    served: list[ServedZarr] = []
    marker = request.node.get_closest_marker(LINK_MARKER)
    defaults = dict(marker.kwargs) if marker is not None else {}

    def serve(path: str | Path | None = None, **settings: Any) -> ServedZarr:
        if path is None:
            path = request.getfixturevalue("era5_zarr")()
        one = serve_zarr(path, **{**defaults, **settings})
        served.append(one)
        return one

    yield serve
    for one in served:
        one.close()


def _benchmark_fixture(request: pytest.FixtureRequest) -> Any:
    """pytest-benchmark's ``benchmark`` fixture, or a failure that says what to install (or enable)."""
    try:
        return request.getfixturevalue("benchmark")
    except pytest.FixtureLookupError:
        installed = importlib.util.find_spec("pytest_benchmark") is not None
        how = (
            "it is installed but not active in this session: drop '-p no:benchmark' (or the setting that disables it)"
            if installed
            else "install it: pip install pytest-benchmark (or insitubatch's 'dev' extra)"
        )
        pytest.fail(f"insitubatch's loader_benchmark fixture times passes with pytest-benchmark; {how}", pytrace=False)


@pytest.fixture
def loader_benchmark(request: pytest.FixtureRequest) -> Callable[..., LoaderBenchmark]:
    """Helper: ``loader_benchmark(served, make_dataset, *, split="train", rounds=1, warm=True, ceiling_rounds=3)``.

    ``make_dataset()`` builds your ``InSituDataset`` over ``served.store()``
    (a fresh one per cold round). The cold passes are what pytest-benchmark
    times; the result (cold and warm samples/s, GETs, bytes, peak resident
    bytes, the ceiling and ``ratio``) is returned and stored in
    ``benchmark.extra_info``. Call it once per test.
    """

    def run(served: ServedZarr, make_dataset: Callable[[], Any], **options: Any) -> LoaderBenchmark:
        from .loader_bench import measure_loader

        benchmark = _benchmark_fixture(request)

        def under_benchmark(setup: Callable[[], Any], target: Callable[..., None], rounds: int) -> None:
            benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)

        result = measure_loader(served, make_dataset, run_rounds=under_benchmark, **options)
        benchmark.extra_info.update(result.to_dict())
        return result

    return run
