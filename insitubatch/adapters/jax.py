"""The JAX adapter: ``jax.Array`` batches over a view, by DLPack, on the device asked for.

``to_jax(view, device=..., device_transform=...)`` is a re-iterable
``JaxView``: each ``for`` is a pass of the view. Its ``spec`` gives every
label's shape and dtype (and the device) as ``jax.ShapeDtypeStruct``s before
the first batch, so ``jax.jit(step).lower(view.spec)`` compiles before a byte
moves. A CPU batch is handed to JAX by DLPack (no copy); to another device it
is copied by ``jax.device_put``.

``to_jax(view, sharding=NamedSharding(mesh, PartitionSpec("data")))``
yields global arrays over several devices, and over several processes once
``jax.distributed.initialize`` ran (the dataset then takes its rank and
world size from JAX): see ``jax_sharding``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import numpy as np

from ..validation import Anything, Flag, Instance, IsCallable, Table, validate_params
from ..views import OTHER_PROCESS_MESSAGE, DatasetView, InferView
from .jax_sharding import GlobalBatches
from .spec import ViewSpec, view_spec

__all__ = ["JaxView", "resolve_jax_device", "to_jax"]

# What a user may call a GPU: JAX's own platform name, and the vendor names torch users type
_GPU_ALIASES = ("gpu", "cuda", "rocm")

JaxItem = dict[str, Any] | tuple[dict[str, Any], Mapping[str, Any] | None]


def _jax():
    try:
        import jax
    except ImportError as exc:  # pragma: no cover - jax is an optional extra
        raise ImportError("to_jax needs JAX: pip install 'insitubatch[jax]'") from exc
    return jax


def _available(jax) -> str:
    devices = {str(d) for d in jax.devices()} | {str(d) for d in jax.devices("cpu")}
    return ", ".join(sorted(devices))


def resolve_jax_device(device: Any = None) -> Any:
    """The ``jax.Device`` that ``device`` names, as a JAX user writes it.

    ``None`` is ``jax.devices()[0]`` (JAX's default); a ``jax.Device`` is
    itself; an int ``i`` is ``jax.devices()[i]``; a string is a platform and
    an optional index: ``"cpu"``, ``"gpu"``, ``"tpu"``, ``"cuda:1"``
    (``"cuda"`` and ``"rocm"`` are the ``"gpu"`` platform).

    Raises
    ------
    ValueError
        No such device here: the message names the device and those available.
    TypeError
        ``device`` is none of those.
    """
    jax = _jax()
    if device is None:
        return jax.devices()[0]
    if isinstance(device, jax.Device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        platform, index, devices = "default", device, jax.devices()
    elif isinstance(device, str):
        platform, _, at = device.strip().lower().partition(":")
        try:
            index = int(at) if at else 0
        except ValueError:
            raise ValueError(f"device={device!r} must be a platform and an index, e.g. 'gpu:0'") from None
        try:
            devices = jax.devices("gpu" if platform in _GPU_ALIASES else platform)
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(
                f"device={device!r} is not available: JAX has no {platform!r} backend here ({reason}); "
                f"devices: {_available(jax)}"
            ) from None
    else:
        raise TypeError(
            f"device must be a jax.Device, a string such as 'gpu:0', or an int, got {type(device).__name__}"
        )
    if not 0 <= index < len(devices):
        raise ValueError(
            f"device={device!r} is not available: the {platform} platform has {len(devices)} device(s) "
            f"({', '.join(str(d) for d in devices)}); devices: {_available(jax)}"
        )
    return devices[index]


# What ``JaxView`` (and ``to_jax``, which makes one) accepts (``validation``); device and sharding exclude each other
VIEW_PARAMETERS: Table = {
    "view": [Instance(DatasetView, "a DatasetView (ds.train, ds.val, ds.infer(...))")],
    "device": [Anything("resolve_jax_device: a jax.Device, a platform string or an index")],
    "device_transform": [IsCallable(), None],
    "coords": [Flag(), None],  # None: pairs on an inference view only
    "sharding": [Anything("GlobalBatches: a NamedSharding whose first spec entry shards the batch axis")],
    "mask": [Instance(str, "a label (str)"), None],  # needs sharding=; not a label of the view: GlobalBatches
}


class JaxView:
    """``dict[label, jax.Array]`` items over a view, on one device or laid out by a sharding; iterate once per epoch.

    ``spec`` and ``last_spec`` describe the items before the first batch.
    With ``coords`` (the default on an inference view) each item is
    ``(arrays, coords)``. Statics are in every item, placed once.
    """

    @validate_params(VIEW_PARAMETERS)
    def __init__(
        self,
        view: DatasetView,
        device: Any = None,
        device_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        coords: bool | None = None,
        sharding: Any = None,
        mask: str | None = None,
    ) -> None:
        if sharding is not None and device is not None:
            raise TypeError("give device= (one device) or sharding= (a global batch over several), not both")
        if mask is not None and sharding is None:
            raise TypeError(f"mask={mask!r} marks rows padded into a global batch: it needs sharding=")
        self.view = view
        self.sharding = sharding
        self.device = resolve_jax_device(device) if sharding is None else None
        # the global layout, checked here: a batch that cannot split over the devices fails before a pass starts
        self._global = (
            None
            if sharding is None
            else GlobalBatches(sharding, view_spec(view), view.planner.rank, view.planner.world_size, mask)
        )
        self.device_transform = device_transform
        self._pairs = isinstance(view, InferView) if coords is None else coords
        self._statics: dict[str, Any] | None = None  # placed on the first batch, kept for every later one
        self._promised: ViewSpec | None = None  # once a spec is handed out, batches are checked against it

    def __len__(self) -> int:
        return len(self.view)

    def __getstate__(self) -> dict:
        raise TypeError(OTHER_PROCESS_MESSAGE)

    def __getitem__(self, index: object) -> NoReturn:
        self.view.__getitem__(index)  # raises: a view is iterated, not indexed, and only in its own process

    def _view_spec(self) -> ViewSpec:
        self._promised = view_spec(self.view)
        return self._promised

    def _structs(self, rows: int) -> dict[str, Any]:
        if self._global is not None:  # every global batch is full (a short one padded)
            self._view_spec()
            return self._global.structs()
        jax = _jax()
        sharding = jax.sharding.SingleDeviceSharding(self.device)
        return {
            label: jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dt), sharding=sharding)
            for label, (shape, dt) in self._view_spec().shapes(rows).items()
        }

    @property
    def spec(self) -> dict[str, Any]:
        """``{label: jax.ShapeDtypeStruct}`` of a full batch (statics too), on this view's device.

        What ``device_transform`` receives (and what each item is without
        one): ``jax.jit(f).lower(view.spec)`` compiles ``f`` before the first
        batch, ``jax.eval_shape(view.device_transform, view.spec)`` gives the
        items after the transform. dtypes are JAX's (float64 is float32
        unless ``jax_enable_x64``).
        """
        return self._structs(self._view_spec().batch_size)

    @property
    def last_spec(self) -> dict[str, Any]:
        """``spec`` of the last batch: fewer rows when the view's samples do not fill it (else equal to ``spec``).

        With a sharding it equals ``spec``: a short batch is padded to full size.
        """
        return self._structs(self._view_spec().last_batch)

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer stands (the view's ``state_dict()``): torchdata's ``Stateful`` protocol.

        Items are placed as they are yielded, none ahead, so the view's count is the consumer's.
        """
        return self.view.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` from ``state_dict()``: the next iteration yields the batches not yet taken."""
        self.view.load_state_dict(state)

    def __iter__(self) -> Iterator[JaxItem]:
        jax = _jax()
        import jax.numpy as jnp

        for batch in self.view:
            if self._promised is not None:
                self._promised.check(batch)
            if self._global is not None:
                if self._statics is None:
                    self._statics = self._global.place_statics(dict(batch.statics))
                arrays = self._global.place(batch)
                arrays.update(self._statics)
                if self.device_transform is not None:
                    arrays = self.device_transform(arrays)
                yield (arrays, batch.coords) if self._pairs else arrays
                continue
            if self._statics is None:  # placed once: a read-only array is copied by device_put, never exported
                self._statics = {label: jax.device_put(a, self.device) for label, a in batch.statics.items()}
            # on the CPU from_dlpack aliases the batch buffer (its export keeps the buffer from reuse);
            # on another device device_put copies it there. JAX takes only compact strides by DLPack:
            # a strided view a batch transform made (a crop, a slice) is copied compact first
            arrays = {
                label: jax.device_put(
                    jnp.from_dlpack(a if a.flags.c_contiguous else np.ascontiguousarray(a)), self.device
                )
                for label, a in batch.arrays.items()
            }
            arrays.update(self._statics)
            if self.device_transform is not None:
                arrays = self.device_transform(arrays)
            yield (arrays, batch.coords) if self._pairs else arrays


def to_jax(
    view: DatasetView,
    *,
    device: Any = None,
    device_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    coords: bool | None = None,
    sharding: Any = None,
    mask: str | None = None,
) -> JaxView:
    """``jax.Array`` batches over ``view`` by DLPack, on ``device`` (default ``jax.devices()[0]``) or over ``sharding``.

    ``device`` is a ``jax.Device``, a platform string (``"cpu"``, ``"gpu"``,
    ``"cuda:1"``, ``"tpu"``) or an index into ``jax.devices()``;
    ``device_transform`` runs on each placed batch (a jitted normalisation).
    ``spec``/``last_spec`` on the result describe the items before the first
    batch. With ``coords=True`` each item is ``(arrays, coords)``: the batch's
    coordinate mapping beside the arrays (``None``, the default, means pairs
    on an inference view only). Statics are in every item, placed once.

    ``sharding``, a ``jax.sharding.NamedSharding`` whose spec's first entry
    shards the batch axis (``NamedSharding(mesh, PartitionSpec("data"))``),
    makes each item a global ``jax.Array``: every device is handed only its
    own rows, and with several processes (``jax.distributed.initialize``) the
    global batch is every process's batch in process order, placed by
    ``jax.make_array_from_process_local_data``. Items then all have the full
    global shape: a short batch is padded by repeating its last row, and
    ``mask="valid"`` adds a ``(rows,)`` bool label that is ``False`` on padded
    rows (and on rows repeated to even out ranks). Statics are replicated on
    every device of the mesh.

    Raises
    ------
    ValueError
        ``device`` names no device here (the message lists the available ones);
        the batch does not split evenly over ``sharding``'s batch-axis shards;
        the view's rank and world size are not JAX's process index and count.
    TypeError
        ``view`` is not a view, ``device_transform`` not callable, ``device`` of no known kind;
        ``sharding`` is not a ``NamedSharding``, or given with ``device``; ``mask`` without ``sharding``.
    """
    _jax()
    return JaxView(view, device=device, device_transform=device_transform, coords=coords, sharding=sharding, mask=mask)
