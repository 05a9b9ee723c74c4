"""The one generator of test, example and benchmark data: ERA5-like zarr groups, by named presets.

:func:`write_era5_like` writes what a :class:`DatasetSpec` describes: several
float32 variables over ``time × lat × lon`` with a chosen number of samples
(time steps) per chunk, an optional inner spatial tiling (each time chunk
split into a grid of stored chunks) and optional sharding along time. The
fields are a seasonal and diurnal cycle over a latitude profile, travelling
planetary waves and Gaussian noise, so zstd compresses them about as well as
real reanalysis (far from zeros, far from random bytes). Generation is
vectorised over blocks of time steps, and the group's metadata is
consolidated, so an HTTP store (which cannot list) opens it.

The presets name the datasets the project reads:

:func:`demo`
    The quick-start demo's (``./dev demo``, the examples, the docs): a year
    of 6-hourly steps on a 32 × 64 grid, variables ``t2m``, ``u10``, ``v10``.
:func:`wb2_64x32`
    WeatherBench2's 64 × 32 equiangular ERA5 (6-hourly, 32 latitudes × 64
    longitudes), with its variable names, so the examples read either
    dataset with the same code; the end-to-end report's data.
:func:`era5_181x360`
    ERA5's 0.25° grid stand-in of 181 × 360 in 2 × 2 stored tiles,
    blosc-zstd: the arena's realistic fields.
:func:`era5_13_levels` / :func:`write_levels`
    ERA5's 13 pressure levels, ``t(time, level, latitude, longitude)``,
    descending latitude, 0..360 longitude, one level per stored chunk,
    written block by block (one time chunk of every level at a time), so a
    store of many times the memory is written in bounded memory: the
    selection benchmark's store.
:func:`era5_levels_dataset` / :func:`write_era5_levels`
    A small ERA5-shaped ``xarray.Dataset`` with pressure levels, descending
    latitude, 0..360 longitude, static masks and a series, written by
    xarray: the oracle's side of coordinate and selection tests.
:func:`six_hourly` / :func:`dated_field` / :func:`write_dated`
    A dated ``t2m(time, lat, lon)`` written by xarray with a CF-encoded (or
    native) time coordinate: the oracle's side of date tests.

The last two are written by ``xarray.Dataset.to_zarr`` (imported when
called), so that the store is what a user's xarray archive looks like.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import math
import os
import shutil
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec
from zarr.errors import ZarrUserWarning

__all__ = [
    "DATED_LAT",
    "DATED_LON",
    "DEMO_CHUNKS",
    "DEMO_SHAPE",
    "DEMO_VARIABLES",
    "ERA5_LEVELS",
    "ERA5_LEVELS_13",
    "WB2_VARIABLES",
    "DatasetSpec",
    "LevelsSpec",
    "dated_field",
    "demo",
    "era5_13_levels",
    "era5_181x360",
    "era5_levels_dataset",
    "six_hourly",
    "wb2_64x32",
    "write_dated",
    "write_era5_levels",
    "write_era5_like",
    "write_levels",
]

# WeatherBench2 ERA5 names, mean and amplitude of the synthetic field (units as ERA5).
_VARIABLE_PHYSICS: dict[str, tuple[float, float]] = {
    "2m_temperature": (278.0, 25.0),
    "10m_u_component_of_wind": (0.0, 8.0),
    "10m_v_component_of_wind": (0.0, 6.0),
    "mean_sea_level_pressure": (101_300.0, 1_500.0),
    "total_column_water_vapour": (25.0, 20.0),
    "geopotential_500": (54_000.0, 2_500.0),
    # ERA5's short names, as the demo calls its variables
    "t2m": (278.0, 25.0),
    "u10": (0.0, 8.0),
    "v10": (0.0, 6.0),
}
WB2_VARIABLES: tuple[str, ...] = (
    "2m_temperature",
    "10m_u_component_of_wind",
    "10m_v_component_of_wind",
    "mean_sea_level_pressure",
)
# WeatherBench2's coarse grid: 64 longitudes x 32 latitudes, 6-hourly steps.
WB2_LAT, WB2_LON = 32, 64
# The one demo dataset (the demo, the examples and the docs all read this shape):
# a year of 6-hourly steps on a coarse 32 x 64 grid, ~36 MB decoded over three variables,
# 16 steps per stored chunk, each chunk cut into two 32 x 32 tiles.
DEMO_SHAPE = (1460, WB2_LAT, WB2_LON)
DEMO_CHUNKS = (16, 32, 32)
DEMO_VARIABLES = ("t2m", "u10", "v10")
# The benchmark arena's realistic layout: ERA5's 0.25-degree grid stand-in of 181 x 360,
# cut into 2 x 2 tiles of 91 x 180, 8 steps per chunk.
ERA5_GRID = (181, 360)
ERA5_TILES = (2, 2)
ERA5_SAMPLES_PER_CHUNK = 8
# The xarray-written oracle stores: ERA5's pressure levels (hPa), and the small grid of the dated field
# (the date tests are about the time axis, not the field).
ERA5_LEVELS = np.array([50, 100, 250, 500, 700, 850, 1000])
DATED_LAT, DATED_LON = 3, 4
# ERA5's (and WeatherBench2's) 13 pressure levels, hPa; the block-wise levels preset's grid, cut into
# 4 x 4 tiles of 32 x 64, and its time steps per chunk.
ERA5_LEVELS_13 = (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000)
LEVELS_GRID = (128, 256)
LEVELS_TILES = (4, 4)
LEVELS_SAMPLES_PER_CHUNK = 8
DATED_STEP = np.timedelta64(6, "h")
STEPS_PER_DAY = 4
STEPS_PER_YEAR = 1460
# Noise as a fraction of each variable's amplitude: enough that zstd cannot
# squeeze the mantissas to nothing, little enough that the fields stay smooth.
NOISE_FRACTION = 0.02
# ERA5 comes from GRIB fields packed to 16 bits over their range; values keep
# that precision in float32, which is what lets zstd compress them ~1.5x.
PACKING_BITS = 16
PACKING_SPAN = 6.0  # the packed range: mean +- 3 amplitudes
DEFAULT_ZSTD_LEVEL = 3
# Time steps generated per vectorised block (bounds the generator's memory).
GENERATE_BLOCK_BYTES = 64 * 2**20
SPEC_ATTR = "bench_dataset_spec"
# Chunk keys "c.0.0.0": one flat directory per array. With zarr's default "/"
# separator every one-sample chunk gets directories of its own, and creating
# (and deleting) tens of thousands of them dominates the write time on a local
# disk. An object store sees the same objects either way (WeatherBench2's own
# zarr v2 keys are "0.0.0").
CHUNK_KEY_ENCODING: dict[str, Any] = {"name": "default", "separator": "."}
# Threads that encode and write chunk files (zstd and file writes release the GIL).
WRITE_THREADS = min(8, (os.cpu_count() or 1) * 2)
EPOCH_UNITS = "hours since 1979-01-01 00:00:00"
HOURS_PER_STEP = 24 // STEPS_PER_DAY
# "zstd": bytes + zstd, as WeatherBench2's own v3 copies; "blosc-zstd": blosc with
# byte shuffle over zstd, zarr v2's long-time default family (shuffle lets zstd
# find the float structure, so it decodes about twice as fast).
Compressor = Literal["zstd", "blosc-zstd"]


@dataclass(frozen=True)
class DatasetSpec:
    """What :func:`write_era5_like` writes.

    ``inner_tiles`` splits each time chunk into ``(lat_tiles, lon_tiles)``
    stored chunks; ``shard_samples`` (a multiple of ``samples_per_chunk``)
    stores that many time steps' chunks in one shard object, and then the
    shard is the stored chunk.
    """

    n_time: int
    n_lat: int = WB2_LAT
    n_lon: int = WB2_LON
    variables: tuple[str, ...] = WB2_VARIABLES
    samples_per_chunk: int = 8
    inner_tiles: tuple[int, int] = (1, 1)
    shard_samples: int | None = None
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    codec: Compressor = "zstd"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_time < 1 or self.n_lat < 1 or self.n_lon < 1:
            raise ValueError(f"shape ({self.n_time}, {self.n_lat}, {self.n_lon}) must be positive")
        if not 1 <= self.samples_per_chunk <= self.n_time:
            raise ValueError(f"samples_per_chunk={self.samples_per_chunk} must be in [1, n_time={self.n_time}]")
        ty, tx = self.inner_tiles
        if not (1 <= ty <= self.n_lat and 1 <= tx <= self.n_lon):
            raise ValueError(
                f"inner_tiles={self.inner_tiles} must be >= 1 and at most the grid ({self.n_lat}, {self.n_lon})"
            )
        if self.shard_samples is not None and (
            self.shard_samples < self.samples_per_chunk or self.shard_samples % self.samples_per_chunk
        ):
            raise ValueError(
                f"shard_samples={self.shard_samples} must be a multiple of samples_per_chunk={self.samples_per_chunk}"
            )
        if self.codec not in ("zstd", "blosc-zstd"):
            raise ValueError(f"codec={self.codec!r} must be 'zstd' or 'blosc-zstd'")
        unknown = [v for v in self.variables if v not in _VARIABLE_PHYSICS]
        if unknown or not self.variables:
            raise ValueError(f"variables {unknown or '()'} unknown; choose from {sorted(_VARIABLE_PHYSICS)}")

    @property
    def chunks(self) -> tuple[int, int, int]:
        """zarr's read chunk: samples per chunk × one spatial tile."""
        ty, tx = self.inner_tiles
        return (self.samples_per_chunk, math.ceil(self.n_lat / ty), math.ceil(self.n_lon / tx))

    @property
    def shards(self) -> tuple[int, int, int] | None:
        if self.shard_samples is None:
            return None
        return (self.shard_samples, self.n_lat, self.n_lon)

    @property
    def sample_nbytes(self) -> int:
        """Decoded bytes of one sample over every variable."""
        return len(self.variables) * self.n_lat * self.n_lon * 4

    @property
    def name(self) -> str:
        """A directory name that encodes the spec (so a changed spec is a new dataset)."""
        ty, tx = self.inner_tiles
        shard = f"_sh{self.shard_samples}" if self.shard_samples else ""
        codec = "_blosc" if self.codec == "blosc-zstd" else ""
        return (
            f"era5_t{self.n_time}_{self.n_lat}x{self.n_lon}_v{len(self.variables)}"
            f"_s{self.samples_per_chunk}_t{ty}x{tx}{shard}{codec}_z{self.zstd_level}_seed{self.seed}.zarr"
        )

    def zarr_compressor(self) -> BloscCodec | ZstdCodec:
        """The array's compressor, as zarr writes it."""
        if self.codec == "blosc-zstd":
            return BloscCodec(cname="zstd", clevel=self.zstd_level, shuffle="shuffle")
        return ZstdCodec(level=self.zstd_level)

    def numcodecs_compressor(self) -> Any:
        """The same compressor in numcodecs, which encodes the same bytes without zarr's per-chunk cost."""
        if self.codec == "blosc-zstd":
            return numcodecs.Blosc(cname="zstd", clevel=self.zstd_level, shuffle=numcodecs.Blosc.SHUFFLE)
        return numcodecs.Zstd(level=self.zstd_level)


def wb2_64x32(n_time: int = STEPS_PER_YEAR, **overrides: Any) -> DatasetSpec:
    """The WeatherBench2 64×32 preset: ``n_time`` 6-hourly steps of 32×64, WB2 variable names."""
    return replace(DatasetSpec(n_time=n_time, n_lat=WB2_LAT, n_lon=WB2_LON, variables=WB2_VARIABLES), **overrides)


def demo(
    shape: tuple[int, int, int] = DEMO_SHAPE, chunks: tuple[int, int, int] = DEMO_CHUNKS, seed: int = 0
) -> DatasetSpec:
    """The demo preset: ``shape`` (time, lat, lon) of ``t2m``, ``u10``, ``v10``, stored in ``chunks``.

    ``chunks`` must tile the grid as an inner tiling does: each spatial
    extent is the grid's cut into equal parts (the last one clipped).
    Raises ``ValueError`` naming ``chunks`` otherwise.
    """
    n, ny, nx = shape
    tiles = (math.ceil(ny / chunks[1]), math.ceil(nx / chunks[2]))
    spec = DatasetSpec(
        n_time=n,
        n_lat=ny,
        n_lon=nx,
        variables=DEMO_VARIABLES,
        samples_per_chunk=chunks[0],
        inner_tiles=tiles,
        seed=seed,
    )
    if spec.chunks != tuple(chunks):
        raise ValueError(f"chunks={tuple(chunks)} do not tile the grid {shape[1:]} evenly; {spec.chunks} would")
    return spec


def era5_181x360(n_time: int, grid: tuple[int, int] = ERA5_GRID, **overrides: Any) -> DatasetSpec:
    """The realistic preset: ``n_time`` steps of the ERA5-grid stand-in, 2 × 2 stored tiles, blosc-zstd, WB2 names."""
    spec = DatasetSpec(
        n_time=n_time,
        n_lat=grid[0],
        n_lon=grid[1],
        variables=WB2_VARIABLES,
        samples_per_chunk=ERA5_SAMPLES_PER_CHUNK,
        inner_tiles=ERA5_TILES,
        codec="blosc-zstd",
    )
    return replace(spec, **overrides)


@dataclass(frozen=True)
class LevelsSpec:
    """What :func:`write_levels` writes: ``t(time, level, latitude, longitude)`` float32, one level per chunk.

    Each stored chunk is ``samples_per_chunk`` steps of one level and one
    tile of the ``tiles`` grid; values are standard normal, drawn block by
    block (one time chunk of every level) from ``seed``.
    """

    n_time: int
    levels: tuple[int, ...] = ERA5_LEVELS_13
    n_lat: int = LEVELS_GRID[0]
    n_lon: int = LEVELS_GRID[1]
    samples_per_chunk: int = LEVELS_SAMPLES_PER_CHUNK
    tiles: tuple[int, int] = LEVELS_TILES
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_time < 1 or self.n_lat < 1 or self.n_lon < 1 or not self.levels:
            raise ValueError(f"shape ({self.n_time}, {len(self.levels)}, {self.n_lat}, {self.n_lon}) must be positive")
        if not 1 <= self.samples_per_chunk <= self.n_time:
            raise ValueError(f"samples_per_chunk={self.samples_per_chunk} must be in [1, n_time={self.n_time}]")
        ty, tx = self.tiles
        if not (1 <= ty <= self.n_lat and 1 <= tx <= self.n_lon):
            raise ValueError(f"tiles={self.tiles} must be >= 1 and at most the grid ({self.n_lat}, {self.n_lon})")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.n_time, len(self.levels), self.n_lat, self.n_lon)

    @property
    def chunks(self) -> tuple[int, int, int, int]:
        """One stored chunk: ``samples_per_chunk`` steps of one level and one tile."""
        ty, tx = self.tiles
        return (self.samples_per_chunk, 1, math.ceil(self.n_lat / ty), math.ceil(self.n_lon / tx))


def era5_13_levels(n_time: int, **overrides: Any) -> LevelsSpec:
    """The block-wise levels preset: ``n_time`` 6-hourly steps of ERA5's 13 levels on 128 × 256, 4 × 4 tiles."""
    return replace(LevelsSpec(n_time=n_time), **overrides)


def write_levels(path: str | Path, spec: LevelsSpec) -> Path:
    """Write ``spec``'s group at ``path`` with zarr, one block of ``samples_per_chunk`` steps at a time.

    Returns the path. The group holds ``t`` with xarray-style dimension
    names and the ``time`` (int64 hours, CF units), ``level``, ``latitude``
    (descending, 90 to -90) and ``longitude`` (0 to 360) coordinates, and
    consolidated metadata (xarray over HTTP, which cannot list, opens it).
    Memory holds one block (all levels of one time chunk), whatever
    ``n_time``; an existing group at ``path`` is replaced.
    """
    path = Path(path)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    lat = np.linspace(90, -90, spec.n_lat)
    lon = np.arange(spec.n_lon) * (360.0 / spec.n_lon)
    for name, values in (("level", np.asarray(spec.levels)), ("latitude", lat), ("longitude", lon)):
        root.create_array(name, shape=values.shape, dtype=values.dtype, dimension_names=(name,))[:] = values
    time_axis = root.create_array("time", shape=(spec.n_time,), dtype="i8", dimension_names=("time",))
    time_axis[:] = np.arange(spec.n_time) * HOURS_PER_STEP
    time_axis.attrs.update({"units": "hours since 2000-01-01", "calendar": "proleptic_gregorian"})
    t = root.create_array(
        "t",
        shape=spec.shape,
        chunks=spec.chunks,
        dtype="f4",
        dimension_names=("time", "level", "latitude", "longitude"),
    )
    rng = np.random.default_rng(spec.seed)
    block = spec.samples_per_chunk
    for start in range(0, spec.n_time, block):
        steps = min(block, spec.n_time - start)
        t[start : start + steps] = rng.standard_normal((steps, *spec.shape[1:]), dtype="f4")
    with warnings.catch_warnings():  # zarr: v3 consolidated metadata is not in the spec yet
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(path)
    return path


def _field(name: str, t: np.ndarray, lat: np.ndarray, lon: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(len(t), len(lat), len(lon))`` float32 values of variable ``name`` at steps ``t``."""
    mean, amp = _VARIABLE_PHYSICS[name]
    tt = t[:, None, None].astype(np.float64)
    phi = np.deg2rad(lat)[None, :, None]
    lam = np.deg2rad(lon)[None, None, :]
    season = np.sin(2 * np.pi * tt / STEPS_PER_YEAR + k) * np.sin(phi)
    diurnal = 0.2 * np.cos(2 * np.pi * tt / STEPS_PER_DAY + lam)
    # zonal wavenumbers 3 and 5 drifting eastward at different speeds
    waves = 0.35 * np.cos(phi) * (np.sin(3 * lam - 0.05 * tt + k) + 0.5 * np.sin(5 * lam + 0.08 * tt))
    profile = np.cos(phi) ** 2 - 0.5
    values = profile + 0.5 * season + diurnal + waves
    values = values + NOISE_FRACTION * rng.standard_normal(values.shape)
    step = PACKING_SPAN * amp / 2**PACKING_BITS
    low = mean - PACKING_SPAN * amp / 2
    return (low + np.round((mean + amp * values - low) / step) * step).astype(np.float32)


def write_era5_like(path: str | Path, spec: DatasetSpec, *, overwrite: bool = False) -> Path:
    """Write the group ``spec`` describes at ``path`` (a directory); reuse it if already written.

    Returns the path. The group holds ``time`` (int64 hours, CF units),
    ``lat`` and ``lon`` coordinates and one ``(time, lat, lon)`` float32 array
    per variable, compressed with ``spec.codec``, with ``dimension_names`` and consolidated
    metadata. An existing group written from the same spec is kept as is;
    one from another spec (or a partial one) is replaced.
    """
    path = Path(path)
    if path.exists():
        if not overwrite and _written_spec(path) == asdict(spec):
            return path
        shutil.rmtree(path)
    rng = np.random.default_rng(spec.seed)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    n, ny, nx = spec.n_time, spec.n_lat, spec.n_lon
    lat = np.linspace(-90 + 90 / ny, 90 - 90 / ny, ny)  # cell centres of an equiangular grid
    lon = np.arange(nx) * (360.0 / nx)
    time_axis = np.arange(n, dtype=np.int64) * HOURS_PER_STEP
    _coordinate(root, "time", time_axis, {"units": EPOCH_UNITS, "calendar": "proleptic_gregorian"})
    _coordinate(root, "lat", lat.astype(np.float32), {"units": "degrees_north"})
    _coordinate(root, "lon", lon.astype(np.float32), {"units": "degrees_east"})
    block = max(spec.samples_per_chunk, GENERATE_BLOCK_BYTES // (ny * nx * 4))
    block -= block % (spec.shard_samples or spec.samples_per_chunk)  # whole chunks (or shards) per write
    block = max(block, spec.shard_samples or spec.samples_per_chunk)
    for k, name in enumerate(spec.variables):
        arr = root.create_array(
            name,
            shape=(n, ny, nx),
            chunks=spec.chunks,
            shards=spec.shards,
            dtype="float32",
            serializer=BytesCodec(),
            compressors=(spec.zarr_compressor(),),
            dimension_names=("time", "lat", "lon"),
            fill_value=float("nan"),
            chunk_key_encoding=CHUNK_KEY_ENCODING,
        )
        for start in range(0, n, block):
            stop = min(n, start + block)
            values = _field(name, np.arange(start, stop), lat, lon, k, rng)
            if spec.shards is None:
                _write_chunks(path / name, arr, values, start, spec)
            else:  # zarr assembles the shards
                arr[start:stop] = values
    root.attrs[SPEC_ATTR] = asdict(spec)
    with warnings.catch_warnings():
        # zarr warns that v3 consolidated metadata is not in the spec yet; we
        # consolidate on purpose, because an HTTP store cannot list members
        warnings.simplefilter("ignore", ZarrUserWarning)
        zarr.consolidate_metadata(path)
    return path


def _write_chunks(directory: Path, arr: zarr.Array, values: np.ndarray, start: int, spec: DatasetSpec) -> None:
    """Encode and write the chunks of ``values`` (rows ``start...``) as zarr would, on a thread pool.

    zarr's own write path costs about a millisecond of Python per chunk; the
    same bytes (little-endian ``bytes`` codec, then the spec's compressor,
    edge chunks padded with the fill value) written here cost a few tens of
    microseconds. Only for unsharded arrays.
    """
    codec = spec.numcodecs_compressor()
    chunk = spec.chunks
    grid = [range(0, e, c) for e, c in zip(values.shape, chunk)]
    fill = np.float32(arr.fill_value)

    def write(origin: tuple[int, int, int]) -> None:
        t, y, x = origin
        part = values[t : t + chunk[0], y : y + chunk[1], x : x + chunk[2]]
        if part.shape != chunk:  # an edge chunk: zarr stores the full chunk shape
            full = np.full(chunk, fill, dtype="<f4")
            full[: part.shape[0], : part.shape[1], : part.shape[2]] = part
            part = full
        key = arr.metadata.encode_chunk_key(((start + t) // chunk[0], y // chunk[1], x // chunk[2]))
        target = directory / key
        if target.parent != directory:
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(codec.encode(np.ascontiguousarray(part, dtype="<f4")))

    with concurrent.futures.ThreadPoolExecutor(WRITE_THREADS) as pool:
        list(pool.map(write, itertools.product(*grid)))


def _coordinate(root: zarr.Group, name: str, values: np.ndarray, attrs: dict[str, str]) -> None:
    arr = root.create_array(name, shape=values.shape, chunks=values.shape, dtype=values.dtype, dimension_names=(name,))
    arr[:] = values
    arr.attrs.update(attrs)


def _written_spec(path: Path) -> dict | None:
    """The spec a complete group at ``path`` was written from, or ``None``."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return None
    try:
        attrs = json.loads(meta.read_text()).get("attributes", {})
    except (OSError, ValueError):
        return None
    found = attrs.get(SPEC_ATTR)
    if isinstance(found, dict):
        found = {k: tuple(v) if isinstance(v, list) else v for k, v in found.items()}
    return found


def era5_levels_dataset(n_time: int = 24, n_lat: int = 17, n_lon: int = 32, seed: int = 0) -> Any:
    """An ERA5-shaped ``xarray.Dataset``: time x level x latitude x longitude, descending latitude, 0..360 longitude.

    ``t`` (float32) and ``z`` (float64) on levels, ``t2m`` at the surface,
    ``lsm`` and ``orog`` static, ``gmean`` a series; 6-hourly
    ``datetime64[ns]`` times from 2000-01-01. Standard-normal values (the
    coordinate and selection tests compare positions, not physics).
    """
    import xarray as xr

    rng = np.random.default_rng(seed)
    time = six_hourly("2000-01-01T00", n_time)
    lat = np.linspace(90, -90, n_lat)
    lon = np.arange(n_lon) * (360.0 / n_lon)
    shape = (n_time, len(ERA5_LEVELS), n_lat, n_lon)
    return xr.Dataset(
        {
            "t": (("time", "level", "latitude", "longitude"), rng.standard_normal(shape).astype("f4")),
            "z": (("time", "level", "latitude", "longitude"), rng.standard_normal(shape).astype("f8")),
            "t2m": (("time", "latitude", "longitude"), rng.standard_normal(shape[:1] + shape[2:]).astype("f4")),
            "lsm": (("latitude", "longitude"), (rng.random((n_lat, n_lon)) > 0.6).astype("f4")),
            "orog": (("latitude", "longitude"), rng.random((n_lat, n_lon)).astype("f4") * 3000),
            "gmean": (("time",), rng.standard_normal(n_time).astype("f4")),
        },
        coords={"time": time, "level": ERA5_LEVELS, "latitude": lat, "longitude": lon},
    )


def write_era5_levels(
    path: str | Path,
    *,
    zarr_format: int = 3,
    chunks: tuple[int, int, int, int] = (4, 1, 9, 16),
    shards: tuple[int, int, int, int] | None = None,
    consolidated: bool = False,
    **dims: int,
) -> Path:
    """Write ``era5_levels_dataset(**dims)`` with xarray: CF-encoded int64 hours, the given chunks (and v3 shards)."""
    ds = era5_levels_dataset(**dims)
    four = {"chunks": chunks} if shards is None else {"chunks": chunks, "shards": shards}
    three = {"chunks": (chunks[0], *chunks[2:])}
    encoding = {
        "t": four,
        "z": four,
        "t2m": three,
        "gmean": {"chunks": (chunks[0],)},
        "time": {"units": "hours since 2000-01-01", "dtype": "int64"},
    }
    ds.to_zarr(path, mode="w", zarr_format=zarr_format, encoding=encoding, consolidated=consolidated)
    return Path(path)


def six_hourly(start: str, steps: int) -> np.ndarray:
    """``steps`` 6-hourly ``datetime64[ns]`` dates from ``start``."""
    return np.datetime64(start, "ns") + np.arange(steps) * DATED_STEP


def dated_field(steps: int, seed: int = 0) -> np.ndarray:
    """``(steps, DATED_LAT, DATED_LON)`` float32 values that differ per step (step ``i`` lies in ``[i, i + 1)``)."""
    rng = np.random.default_rng(seed)
    values = np.arange(steps, dtype="f4")[:, None, None] + rng.random((steps, DATED_LAT, DATED_LON), dtype="f4")
    return values.astype("f4")


def write_dated(
    path: str | Path,
    times: Any,
    *,
    chunk: int = 7,
    zarr_format: int = 3,
    encoding: dict[str, Any] | None = None,
) -> Path:
    """An xarray-written store of ``t2m(time, lat, lon)`` over ``times``, chunked ``chunk`` steps along ``time``.

    ``encoding`` is the time coordinate's (CF units and dtype); without one
    xarray chooses, as it does for a user's archive.
    """
    import xarray as xr

    n = len(times)
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), dated_field(n))},
        coords={"time": times, "lat": np.linspace(60.0, -60.0, DATED_LAT), "lon": np.arange(DATED_LON) * 90.0},
    )
    enc = {"t2m": {"chunks": (chunk, DATED_LAT, DATED_LON)}}
    if encoding is not None:
        enc["time"] = encoding
    ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=False, encoding=enc)
    return Path(path)
