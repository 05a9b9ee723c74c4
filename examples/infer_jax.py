"""Inference with JAX: a sequential pass over a time range, arrays placed on a JAX device.

    python examples/infer_jax.py --start 100 --stop 400

``ds.infer`` validates the range (a window that would read off the archive
raises instead of being dropped) and each batch carries the time coordinate
of its samples; ``to_jax`` hands the batch buffers to JAX by DLPack and, on
an inference view, yields ``(arrays, coords)`` pairs.
"""

from __future__ import annotations

import argparse

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # the jax extra
    raise SystemExit("infer_jax.py needs JAX: pip install 'insitubatch[jax]'") from exc

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk, to_jax
from insitubatch.tools.demo import DEFAULT_PATH, write_demo_dataset


@jax.jit
def persistence_error(now: jax.Array, later: jax.Array) -> jax.Array:
    """A baseline 'model': how wrong persistence is, per sample (RMSE over the grid)."""
    return jnp.sqrt(jnp.mean((later - now) ** 2, axis=(1, 2)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--stop", type=int, default=400)
    parser.add_argument("--lead", type=int, default=4)
    args = parser.parse_args(argv)

    store = obstore_store(write_demo_dataset(args.path), read_only=True)
    t2m = open_geometries(store)["t2m"]
    variables = {"now": t2m, "later": t2m.shift(args.lead)}
    with InSituDataset(store, split_by_chunk(t2m, fractions=(1.0,)), variables, batch_size=64) as ds:
        view = ds.infer((args.start, args.stop))
        errors, times = [], []
        for arrays, coords in to_jax(view):
            errors.append(np.asarray(persistence_error(arrays["now"], arrays["later"])))
            times.append(coords["time"])  # the time of each sample of this batch
    err, times = np.concatenate(errors), np.concatenate(times)
    print(
        f"{len(err)} samples on {jax.devices()[0]}: persistence RMSE at lead {args.lead} "
        f"mean {err.mean():.3f} K, max {err.max():.3f} K (valid {times[0]} .. {times[-1]})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
