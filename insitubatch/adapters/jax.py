"""The JAX adapter: ``jax.Array`` batches over a view, by DLPack."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..views import DatasetView, InferView

__all__ = ["to_jax"]


def to_jax(
    view: DatasetView, *, device: Any = None, coords: bool | None = None
) -> Iterator[dict[str, Any] | tuple[dict[str, Any], Mapping[str, Any] | None]]:
    """``jax.Array`` batches over ``view`` by DLPack, placed on ``device`` (default ``jax.devices()[0]``).

    With ``coords=True`` each item is ``(arrays, coords)``: the batch's
    coordinate mapping beside the arrays (``None``, the default, means pairs
    on an inference view only). Statics are in every item, placed once.
    """
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:  # pragma: no cover - jax is an optional extra
        raise ImportError("to_jax needs JAX: pip install 'insitubatch[jax]'") from exc
    if not isinstance(view, DatasetView):
        raise TypeError(f"view must be a DatasetView, got {type(view).__name__}")
    if coords is not None and not isinstance(coords, bool):
        raise TypeError(f"coords must be True, False or None (pairs on an inference view), got {coords!r}")
    target = device if device is not None else jax.devices()[0]
    pairs = isinstance(view, InferView) if coords is None else coords

    def batches() -> Iterator[dict[str, Any] | tuple[dict[str, Any], Mapping[str, Any] | None]]:
        statics: dict[str, Any] | None = None
        for batch in view:
            if statics is None:  # placed once: a read-only array is copied by device_put, never exported
                statics = {label: jax.device_put(arr, target) for label, arr in batch.statics.items()}
            arrays = {label: jax.device_put(jnp.from_dlpack(arr), target) for label, arr in batch.arrays.items()}
            arrays.update(statics)
            yield (arrays, batch.coords) if pairs else arrays

    return batches()
