"""Framework adapters: torch and JAX tensors over a view's batches, by DLPack (``pinned``: CUDA host buffers)."""

from __future__ import annotations

from .jax import JaxView, to_jax
from .torch import TorchView, as_torch, to_torch

__all__ = ["JaxView", "TorchView", "as_torch", "to_jax", "to_torch"]
