"""The JAX adapter: ``jax.Array`` batches over a view, by DLPack."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..views import DatasetView, InferView

__all__ = ["to_jax"]


def to_jax(
    view: DatasetView, *, device: Any = None
) -> Iterator[dict[str, Any] | tuple[dict[str, Any], Mapping[str, Any] | None]]:
    """``jax.Array`` batches over ``view`` by DLPack, placed on ``device`` (default ``jax.devices()[0]``).

    On an inference view each item is ``(arrays, coords)``: the batch's coordinate mapping beside the arrays.
    """
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:  # pragma: no cover - jax is an optional extra
        raise ImportError("to_jax needs JAX: pip install 'insitubatch[jax]'") from exc
    if not isinstance(view, DatasetView):
        raise TypeError(f"view must be a DatasetView, got {type(view).__name__}")
    target = device if device is not None else jax.devices()[0]
    coords = isinstance(view, InferView)

    def batches() -> Iterator[dict[str, Any] | tuple[dict[str, Any], Mapping[str, Any] | None]]:
        for batch in view:
            arrays = {label: jax.device_put(jnp.from_dlpack(arr), target) for label, arr in batch.arrays.items()}
            yield (arrays, batch.coords) if coords else arrays

    return batches()
