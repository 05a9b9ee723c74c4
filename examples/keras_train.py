"""Train a Keras 3 model from insitubatch, on the torch or the JAX backend.

    python examples/keras_train.py --backend torch --epochs 2
    python examples/keras_train.py --backend jax --epochs 2

Keras picks its backend when it is first imported, from ``KERAS_BACKEND``:
this script sets it from ``--backend`` before ``import keras``. The batches
come from the adapter of that backend (``as_torch`` for torch, ``to_jax``
for JAX), so they reach the model as the backend's own tensors, without a
trip through numpy. ``model.fit`` takes a Python generator: ``xy`` turns the
view's items into ``(x, y)`` pairs and walks the epochs itself (setting
each one, so each epoch has its own shuffle), and ``steps_per_epoch`` is
``len(view)`` so Keras's epochs and the view's coincide.

The model is a small residual convolution predicting ``t2m`` six hours
ahead from ``t2m`` now, a stand-in for a real forecast model.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from typing import Any

from insitubatch import InSituDataset, as_torch, obstore_store, open_geometries, split_by_chunk, to_jax
from insitubatch.tools.demo import DEFAULT_PATH, write_demo_dataset

BACKENDS = ("torch", "jax")
LEAD = 1  # steps ahead (one 6-hourly step)


def xy(items: Iterable[dict[str, Any]], view: Any, epochs: int, x: str, y: str) -> Iterator[tuple[Any, Any]]:
    """``(items[x], items[y])`` of every batch of ``epochs`` epochs in turn: what ``model.fit`` takes."""
    for epoch in range(epochs):
        view.set_epoch(epoch)
        for item in items:  # one pass of the view per epoch
            yield item[x], item[y]


def build_model(keras: Any, shape: tuple[int, ...]) -> Any:
    """A residual 3×3 convolution: the forecast is now plus a learned local correction."""
    now = keras.Input(shape)
    grid = keras.layers.Reshape((*shape, 1))(now)
    hidden = keras.layers.Conv2D(8, 3, padding="same", activation="tanh")(grid)
    change = keras.layers.Reshape(shape)(keras.layers.Conv2D(1, 3, padding="same")(hidden))
    return keras.Model(now, keras.layers.Add()([now, change]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default="torch")
    parser.add_argument("--path", default=DEFAULT_PATH)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=None, help="train on the first N samples only")
    args = parser.parse_args(argv)

    os.environ["KERAS_BACKEND"] = args.backend  # before keras is imported, or the choice is ignored
    import keras

    assert keras.backend.backend() == args.backend, "keras was imported before KERAS_BACKEND was set"
    keras.utils.set_random_seed(0)

    store = obstore_store(write_demo_dataset(args.path), read_only=True)
    t2m = open_geometries(store)["t2m"]
    sample_range = None if args.samples is None else (0, args.samples)
    manifest = split_by_chunk(t2m, fractions=(0.9, 0.1), sample_range=sample_range)
    variables = {"now": t2m, "later": t2m.shift(LEAD)}
    with InSituDataset(store, manifest, variables, batch_size=args.batch_size) as ds:
        items = as_torch(ds.train) if args.backend == "torch" else to_jax(ds.train)
        model = build_model(keras, t2m.inner_shape)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        history = model.fit(
            xy(items, ds.train, args.epochs, "now", "later"),
            epochs=args.epochs,
            steps_per_epoch=len(items),
            shuffle=False,  # the view shuffles: Keras cannot shuffle a generator
            verbose=0,
        )
        for epoch, loss in enumerate(history.history["loss"]):
            print(f"epoch {epoch}: {len(items)} steps, loss {loss:.4f}")
    print(f"backend {keras.backend.backend()}: trained {args.epochs} epochs of {len(items)} batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
