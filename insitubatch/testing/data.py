"""ERA5-like zarr v3 groups for the benchmark: smooth weather fields plus noise, zstd.

:func:`write_era5_like` writes several float32 variables over
``time × lat × lon`` with a chosen number of samples (time steps) per chunk,
an optional inner spatial tiling (each time chunk split into a grid of
stored chunks) and optional sharding along time. The fields are a seasonal
and diurnal cycle over a latitude profile, travelling planetary waves and
Gaussian noise, so zstd compresses them about as well as real reanalysis
(far from zeros, far from random bytes). Generation is vectorised over
blocks of time steps, and the group's metadata is consolidated, so an HTTP
store (which cannot list) opens it.

:func:`wb2_64x32` is the preset the size of WeatherBench2's 64×32
equiangular ERA5 (6-hourly, 32 latitudes × 64 longitudes), with its
variable names, so the examples read either dataset with the same code.
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

__all__ = ["WB2_VARIABLES", "DatasetSpec", "wb2_64x32", "write_era5_like"]

# WeatherBench2 ERA5 names, mean and amplitude of the synthetic field (units as ERA5).
_VARIABLE_PHYSICS: dict[str, tuple[float, float]] = {
    "2m_temperature": (278.0, 25.0),
    "10m_u_component_of_wind": (0.0, 8.0),
    "10m_v_component_of_wind": (0.0, 6.0),
    "mean_sea_level_pressure": (101_300.0, 1_500.0),
    "total_column_water_vapour": (25.0, 20.0),
    "geopotential_500": (54_000.0, 2_500.0),
}
WB2_VARIABLES: tuple[str, ...] = (
    "2m_temperature",
    "10m_u_component_of_wind",
    "10m_v_component_of_wind",
    "mean_sea_level_pressure",
)
# WeatherBench2's coarse grid: 64 longitudes x 32 latitudes, 6-hourly steps.
WB2_LAT, WB2_LON = 32, 64
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
