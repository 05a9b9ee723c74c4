"""The torch adapter: tensors over a view's batches, by DLPack.

On the CPU a tensor aliases the batch buffer (no copy); the buffer pool sees
the export as a reference, so a kept tensor is never overwritten. With a CUDA
``device``, batch buffers come from page-locked memory and each batch is
copied on a side stream one batch ahead, so the copy overlaps the step.
``spec`` gives every label's shape and dtype before the first batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .._engine.passes.batch import Batch
from ..validation import Anything, Flag, Instance, IsCallable, Table, validate_params
from ..views import OTHER_PROCESS_MESSAGE, DatasetView, InferView
from .spec import ViewSpec, view_spec

__all__ = ["TorchView", "as_torch", "to_torch"]


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is an optional extra
        raise ImportError("as_torch needs PyTorch: pip install 'insitubatch[torch]'") from exc
    return torch


if TYPE_CHECKING:
    from torch.utils.data import IterableDataset as _IterableBase
else:
    try:  # torch is optional: without it TorchView still imports, and as_torch explains what to install
        from torch.utils.data import IterableDataset as _IterableBase
    except ImportError:  # pragma: no cover
        _IterableBase = object

# What ``TorchView`` (and ``as_torch``, which makes one) accepts (``validation``)
VIEW_PARAMETERS: Table = {
    "view": [Instance(DatasetView, "a DatasetView (ds.train, ds.val, ds.infer(...))")],
    "device": [Anything("torch.device: 'cpu', 'cuda', 'cuda:1' or a torch.device")],
    "device_transform": [IsCallable(), None],
    "coords": [Flag(), None],  # None: pairs on an inference view only
    "mask_key": [Instance(str, "a str (the key of the padding mask)"), None],  # not a label: checked against them
}
# What ``to_torch`` accepts
BATCH_PARAMETERS: Table = {
    "batch": [Instance(Batch, "an insitubatch Batch")],
    "device": [Anything("torch.device: 'cpu', 'cuda', 'cuda:1' or a torch.device")],
    "coords": [Flag(), None],
}

# An item: the tensors by label (statics included), or with coords (tensors, the batch's coords)
TorchItem = dict[str, Any] | tuple[dict[str, Any], Mapping[str, np.ndarray] | None]


class TorchView(_IterableBase):
    """An ``IterableDataset`` of ``dict[label, torch.Tensor]``; use it with ``batch_size=None``.

    With ``coords`` (the default on an inference view, ``ds.infer(...)``) each
    item is ``(tensors, coords)``. The dataset's statics are in every item's
    dict under their labels: the same tensors each time, moved to ``device`` once.
    ``spec`` and ``last_spec`` describe the items before the first batch.
    """

    @validate_params(VIEW_PARAMETERS)
    def __init__(
        self,
        view: DatasetView,
        device: Any = None,
        device_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        coords: bool | None = None,
        mask_key: str | None = None,
    ) -> None:
        torch = _torch()
        self.view = view
        try:
            self.device = torch.device(device) if device is not None else None
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1'): {exc}") from None
        self.device_transform = device_transform
        self._coords = isinstance(view, InferView) if coords is None else coords  # items are (tensors, coords) pairs
        taken = {*view.geometries, *view.context.statics}
        if mask_key in taken:
            raise ValueError(f"mask_key={mask_key!r} must not name a label; the labels are {sorted(taken)}")
        self.mask_key = mask_key  # each item's ``batch.padded`` under this key, as a bool tensor
        self._statics: dict[str, Any] | None = None  # the statics as tensors on the device, made once
        self._promised: ViewSpec | None = None  # once a spec is handed out, batches are checked against it
        self._cuda = self.device is not None and self.device.type == "cuda"
        # (epoch, batches) the view handed over that the consumer has not taken (the CUDA path stages one ahead)
        self._ahead: tuple[int, int] = (0, 0)
        if self._cuda:
            if not torch.cuda.is_available():
                raise ValueError(f"device={device!r} needs CUDA, but torch.cuda.is_available() is False")
            from .pinned import PinnedBufferPool

            self._pinned = PinnedBufferPool()
            view.context.buffers.set_allocator(lambda shape, dtype: self._pinned.acquire(shape, dtype))

    def __len__(self) -> int:
        return len(self.view)

    def _specs(self, last: bool) -> dict[str, tuple[Any, Any]]:
        torch = _torch()
        self._promised = spec = view_spec(self.view)
        rows = spec.last_batch if last else spec.batch_size
        specs = {
            label: (torch.Size(shape), torch.from_numpy(np.empty(0, dtype=dt)).dtype)
            for label, (shape, dt) in spec.shapes(rows).items()
        }
        if self.mask_key is not None:
            specs[self.mask_key] = (torch.Size((rows,)), torch.bool)
        return specs

    @property
    def spec(self) -> dict[str, tuple[Any, Any]]:
        """``{label: (torch.Size, torch.dtype)}`` of a full batch (statics too), before the first batch.

        What ``device_transform`` receives, and each item without one: make
        ``torch.empty(shape, dtype=dtype, device=...)`` inputs to warm a model up.
        """
        return self._specs(last=False)

    @property
    def last_spec(self) -> dict[str, tuple[Any, Any]]:
        """``spec`` of the last batch: fewer rows when the view's samples do not fill it (else equal to ``spec``)."""
        return self._specs(last=True)

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer stands: the view's ``state_dict()``, counting only the items already yielded.

        torchdata's ``Stateful`` protocol: Lightning (a loader returned as it
        is) and ``StatefulDataLoader`` save it with the model. A batch staged
        ahead for the device but not yet yielded counts as not taken, so the
        restored pass yields it.
        """
        state = self.view.state_dict()
        epoch, ahead = self._ahead
        if ahead and state["epoch"] == epoch:
            state["batches_consumed"] = max(0, state["batches_consumed"] - ahead)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` (from ``state_dict()``): the next iteration yields the batches not yet taken.

        Raises
        ------
        ValueError
            The state is of another pass (split, seed, batch size, ...), as ``DatasetView.load_state_dict``.
        """
        self.view.load_state_dict(state)
        self._ahead = (0, 0)

    def __getstate__(self) -> dict:
        raise TypeError(OTHER_PROCESS_MESSAGE)

    def __iter__(self) -> Iterator[TorchItem]:
        torch = _torch()
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(OTHER_PROCESS_MESSAGE)
        if self._cuda:
            return self._iter_cuda(torch)
        return self._iter_host(torch)

    def _static_tensors(self, torch, batch: Batch) -> dict[str, Any]:
        """The statics as tensors on the device: converted (and copied) on the first batch only."""
        if self._statics is None:
            statics = {label: torch.from_dlpack(arr) for label, arr in batch.statics.items()}
            if self.device is not None:
                statics = {k: t.to(self.device) for k, t in statics.items()}
            self._statics = statics
        return self._statics

    def _host_tensors(self, torch, batch: Batch) -> dict[str, Any]:
        """The batch's arrays as CPU tensors (aliasing its buffers), with its padding mask under ``mask_key``."""
        tensors = {label: torch.from_dlpack(arr) for label, arr in batch.arrays.items()}
        if self.mask_key is not None:
            tensors[self.mask_key] = torch.from_numpy(np.ascontiguousarray(batch.padded))
        return tensors

    def _iter_host(self, torch) -> Iterator[TorchItem]:
        for batch in self.view:
            if self._promised is not None:
                self._promised.check(batch)
            tensors = self._host_tensors(torch, batch)
            if self.device is not None:
                tensors = {k: t.to(self.device) for k, t in tensors.items()}
            tensors.update(self._static_tensors(torch, batch))
            if self.device_transform is not None:
                tensors = self.device_transform(tensors)
            yield (tensors, batch.coords) if self._coords else tensors

    def _iter_cuda(self, torch) -> Iterator[TorchItem]:
        side = torch.cuda.Stream(device=self.device)
        pending = None
        self._ahead = (0, 0)
        for batch in self.view:
            if self._promised is not None:
                self._promised.check(batch)
            host = self._host_tensors(torch, batch)
            with torch.cuda.stream(side):
                dev = {k: t.to(self.device, non_blocking=True) for k, t in host.items()}
                done = torch.cuda.Event()
                done.record(side)
            staged = (dev, done, host, batch)
            if pending is not None:
                item = self._finish(torch, pending)
                self._ahead = (batch.epoch, 1)  # ``staged`` left the view but is not the consumer's yet
                yield item
                self._ahead = (0, 0)
            pending = staged
        if pending is not None:
            yield self._finish(torch, pending)

    def _finish(self, torch, staged) -> TorchItem:
        dev, done, host, batch = staged
        coords = batch.coords
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        for t in dev.values():
            t.record_stream(current)
        # the host buffer may be reused only once its copy has landed
        done.synchronize()
        dev.update(self._static_tensors(torch, batch))
        del host, batch
        tensors = self.device_transform(dev) if self.device_transform is not None else dev
        return (tensors, coords) if self._coords else tensors


def as_torch(
    view: DatasetView,
    *,
    device: Any = None,
    device_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    coords: bool | None = None,
    mask_key: str | None = None,
) -> TorchView:
    """Torch tensors over ``view``: zero-copy on CPU; pinned buffers + async copy to a CUDA ``device``.

    The result is a ``torch.utils.data.IterableDataset``; wrap it as
    ``DataLoader(tv, batch_size=None, num_workers=0)`` if a DataLoader is
    wanted. ``device_transform`` runs on the device tensors. With
    ``coords=True`` each item is ``(tensors, coords)``: the batch's
    coordinate mapping (``Batch.coords``) beside the tensors; ``None`` (the
    default) means pairs on an inference view only. Statics are in every
    item's dict, moved to ``device`` once. ``spec``/``last_spec`` on the
    result describe the items before the first batch. With ``mask_key``
    each item also holds ``batch.padded`` under that key: a ``(batch,)``
    bool tensor, ``True`` for rows repeated to fill a batch (``last_batch="pad"``).
    """
    return TorchView(view, device=device, device_transform=device_transform, coords=coords, mask_key=mask_key)


@validate_params(BATCH_PARAMETERS)
def to_torch(batch: Batch, *, device: Any = None, coords: bool = False) -> dict[str, Any] | TorchItem:
    """One batch as ``{label: torch.Tensor}`` by DLPack (zero-copy on the CPU), moved to ``device`` if given.

    Statics are included under their labels; ``coords=True`` returns ``(tensors, batch.coords)``.
    """
    torch = _torch()
    try:
        target = torch.device(device) if device is not None else None
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1'): {exc}") from None
    tensors: dict[str, Any] = {
        label: torch.from_dlpack(arr) for label, arr in {**batch.arrays, **batch.statics}.items()
    }
    if target is not None:
        tensors = {k: t.to(target) for k, t in tensors.items()}
    return (tensors, batch.coords) if coords else tensors
