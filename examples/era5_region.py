"""Train on two pressure levels of one region plus the land-sea mask, reading only those tiles.

Builds an ERA5-shaped store with xarray (time x level x latitude x
longitude, latitude descending, longitude 0..360, CF-encoded time, a
land-sea mask without a time axis), then trains a tiny CNN to predict 850 hPa
temperature six hours ahead over Europe from the last two steps at 850 and
500 hPa and the mask. The loader reads only the stored tiles the selection
touches; it prints how many GETs that was against the whole field.

    python examples/era5_region.py                  # writes demo_data/era5_levels.zarr on first use
    python examples/era5_region.py --path /data/era5.zarr --epochs 2

Needs xarray (the ``bench`` extra, or ``pip install xarray``) to build the
store, and torch for the model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from insitubatch import InSituDataset, as_torch, open_geometries, open_statics, split_by_chunk

LEVELS = np.array([50, 100, 250, 500, 700, 850, 925, 1000])
EUROPE = {"latitude": slice(72, 34), "longitude": slice(348.75, 45)}


def write_store(path: Path, n_time: int = 8 * 92) -> Path:
    """A season of 6-hourly steps at 5.625 degrees: one level per stored chunk, the globe in 2 x 2 tiles."""
    try:
        import xarray as xr
    except ImportError:
        raise SystemExit(
            "this example builds its store with xarray: pip install xarray (or insitubatch[bench])"
        ) from None
    rng = np.random.default_rng(0)
    time_axis = np.datetime64("2020-06-01T00", "ns") + np.arange(n_time) * np.timedelta64(6, "h")
    lat, lon = np.linspace(90, -90, 33), np.arange(64) * 5.625
    phase = np.arange(n_time)[:, None, None, None] / 4.0
    field = (
        250 + 20 * np.cos(np.deg2rad(lat))[None, None, :, None] + np.sin(phase + np.deg2rad(lon)[None, None, None, :])
    )
    temperature = (field + rng.standard_normal((n_time, len(LEVELS), 33, 64))).astype("f4")
    ds = xr.Dataset(
        {
            "temperature": (("time", "level", "latitude", "longitude"), temperature),
            "land_sea_mask": (("latitude", "longitude"), (rng.random((33, 64)) > 0.7).astype("f4")),
        },
        coords={"time": time_axis, "level": LEVELS, "latitude": lat, "longitude": lon},
    )
    encoding = {
        "temperature": {"chunks": (8, 1, 17, 32)},
        "time": {"units": "hours since 1979-01-01", "dtype": "int64"},
    }
    ds.to_zarr(path, mode="w", consolidated=False, encoding=encoding)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="demo_data/era5_levels.zarr", help="the store (written if missing)")
    parser.add_argument("--epochs", type=int, default=1, help="training epochs (default: 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch (default: 32)")
    args = parser.parse_args(argv)
    import torch

    path = Path(args.path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_store(path)
    t = open_geometries(str(path))["temperature"]
    region = t.sel(level=[850, 500], **EUROPE)
    mask = open_statics(str(path))["land_sea_mask"].sel(**EUROPE)
    variables = {"inputs": region.window([-1, 0]), "target": region.sel(level=850).shift(1)}
    manifest = split_by_chunk(t, fractions=(0.8, 0.2))
    model = torch.nn.Conv2d(2 * 2 + 1, 1, kernel_size=3, padding=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with InSituDataset(str(path), manifest, variables, statics={"lsm": mask}, batch_size=args.batch_size) as ds:
        print(f"reads {region.source}: {region.tiles_read} of {t.tiles_per_chunk} tiles per chunk")
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            t0, losses = time.perf_counter(), []
            for item in as_torch(ds.train):
                x = item["inputs"].flatten(1, 2)  # (batch, steps x levels, lat, lon)
                lsm = item["lsm"].expand(len(x), 1, *item["lsm"].shape)
                pred = model(torch.cat([(x - 250) / 20, lsm], dim=1))
                loss = torch.nn.functional.mse_loss(pred[:, 0], (item["target"] - 250) / 20)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            print(
                f"epoch {epoch}: loss {np.mean(losses):.3f}, {ds.gets} GETs, "
                f"{time.perf_counter() - t0:.1f} s, field {tuple(item['inputs'].shape[1:])}"
            )
        whole = InSituDataset(str(path), manifest, {"t": t}, batch_size=args.batch_size)
        full_gets = whole.describe()["splits"]["train"]["gets"]
        whole.close()
        print(f"the whole field would cost {full_gets} GETs per epoch")


if __name__ == "__main__":
    main()
