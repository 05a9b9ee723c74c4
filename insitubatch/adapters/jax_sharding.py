"""Global batches: a view's batches as ``jax.Array``s laid out by a ``NamedSharding`` over the batch axis.

Every process of a job holds its own rank's batch of ``batch_size`` rows; the
global batch is the processes' batches one after another, in process order
(``batch_size × process_count`` rows). The sharding's partition spec lays it
out, its first entry splitting the batch axis over mesh axes. Rows never
gather on one device first: in one process each device is handed its own
rows (``jax.device_put`` of its slice, then
``jax.make_array_from_single_device_arrays``); across processes
``jax.make_array_from_process_local_data`` places each process's rows on its
own devices.

Every item has the same global shape, so one compiled step serves the whole
pass and no process waits on a shape another never sends: a short batch (the
last of a pass, possibly of different lengths on different ranks) is padded
to ``batch_size`` rows by repeating its last row. The optional mask label
says which rows are real: ``False`` on those padded rows and on rows the
distributed planner repeated to even out ranks (``remainder="pad"``).
Statics are replicated on every device of the mesh, placed once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._engine.passes.batch import Batch
from .spec import ViewSpec

__all__ = ["GlobalBatches"]


class GlobalBatches:
    """Places a process's batches as global ``jax.Array``s of ``sharding``; validates the layout up front.

    Parameters
    ----------
    sharding
        A ``jax.sharding.NamedSharding`` whose spec's first entry shards the batch axis.
    spec
        The view's items (labels, row shapes, dtypes, batch size).
    rank, world_size
        The view's rank and world size; with JAX initialised for several
        processes they must be ``jax.process_index()`` and ``jax.process_count()``.
    mask
        A label under which each item carries the ``(global rows,)`` bool
        array of real rows, or ``None`` for none.

    Raises
    ------
    TypeError
        ``sharding`` is not a ``NamedSharding``; ``mask`` is not a string.
    ValueError
        The batch does not split evenly over the sharding's batch-axis shards;
        the view's ranks are not JAX's processes; ``mask`` names a label of the view.
    """

    def __init__(self, sharding: Any, spec: ViewSpec, rank: int, world_size: int, mask: str | None = None) -> None:
        import jax

        if not isinstance(sharding, jax.sharding.NamedSharding):
            raise TypeError(
                "sharding must be a jax.sharding.NamedSharding over the batch axis, e.g. "
                f"NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data')); got {type(sharding).__name__}"
            )
        if mask is not None and mask in spec.shapes(spec.batch_size):
            raise ValueError(f"mask={mask!r} is a label of the view already; name the mask something else")
        self.processes = jax.process_count()
        if self.processes > 1 and (rank, world_size) != (jax.process_index(), self.processes):
            raise ValueError(
                f"the view is rank {rank} of world_size={world_size}, but JAX runs process "
                f"{jax.process_index()} of {self.processes}: a global batch is one rank's batch per process; "
                "open the dataset with rank=None and world_size=None to take JAX's processes"
            )
        self.sharding = sharding
        self.replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
        self.mask = mask
        self.spec = spec
        self.rows = spec.batch_size  # this process's rows in every item
        for label, (shape, _dt) in self.shapes().items():
            try:
                sharding.shard_shape(shape)
            except ValueError as exc:
                raise ValueError(
                    f"label {label!r} of global shape {shape} ({self.rows} rows × {self.processes} process(es)) "
                    f"does not split evenly over sharding {sharding.spec} of mesh {dict(sharding.mesh.shape)}: "
                    "make batch_size a multiple of this process's devices along the batch axis"
                ) from exc

    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Every batch label's global shape and dtype (statics and the mask excluded)."""
        return {label: ((self.rows * self.processes, *shape), dt) for label, (shape, dt) in self.spec.rows.items()}

    def structs(self) -> dict[str, Any]:
        """``{label: jax.ShapeDtypeStruct}`` of every item: global batch labels, the mask, replicated statics."""
        import jax

        out = {
            label: jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dt), sharding=self.sharding)
            for label, (shape, dt) in self.shapes().items()
        }
        if self.mask is not None:
            out[self.mask] = jax.ShapeDtypeStruct((self.rows * self.processes,), np.bool_, sharding=self._rows_sharding)
        for label, (shape, dt) in self.spec.statics.items():
            out[label] = jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dt), sharding=self.replicated)
        return out

    @property
    def _rows_sharding(self) -> Any:
        """The mask's sharding: the batch axis's entry of the spec alone (a 1-D array has no other axis)."""
        import jax

        return jax.sharding.NamedSharding(self.sharding.mesh, jax.sharding.PartitionSpec(*self.sharding.spec[:1]))

    def place(self, batch: Batch) -> dict[str, Any]:
        """The batch's labels (and mask) as global arrays: each device gets its rows, nothing else."""
        n = len(batch)
        out = {label: self._global(self._full(a, n), self.sharding) for label, a in batch.arrays.items()}
        if self.mask is not None:
            real = np.zeros(self.rows, dtype=bool)
            real[:n] = True
            padded = batch.extras.get("padded")
            if padded is not None:
                real[:n] &= ~np.asarray(padded, dtype=bool)
            out[self.mask] = self._global(real, self._rows_sharding)
        return out

    def place_statics(self, statics: dict[str, np.ndarray]) -> dict[str, Any]:
        """Statics replicated on every device of the mesh (every process passes the same values)."""
        import jax

        return {
            label: jax.make_array_from_callback(a.shape, self.replicated, a.__getitem__) for label, a in statics.items()
        }

    def _full(self, a: np.ndarray, n: int) -> np.ndarray:
        """``a`` with ``self.rows`` rows: a short batch padded by repeating its last row."""
        if n == self.rows:
            return a
        return np.concatenate([a, np.repeat(a[n - 1 : n], self.rows - n, axis=0)])

    def _global(self, host: np.ndarray, sharding: Any) -> Any:
        import jax

        shape = (host.shape[0] * self.processes, *host.shape[1:])
        if self.processes > 1:
            return jax.make_array_from_process_local_data(sharding, host, shape)
        # one process: each device gets its own slice (a device sharing a slice with another gets its own copy)
        shards = [
            jax.device_put(host[index], d) for d, index in sharding.addressable_devices_indices_map(shape).items()
        ]
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)
