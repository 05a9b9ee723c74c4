"""The Lightning adapter: a ``LightningDataModule`` over a zarr store's splits, resumable mid-epoch.

Each process opens its own ``InSituDataset`` in ``setup`` with the trainer's
rank and world size, so under DDP every rank reads only its share. The
loaders are ``TorchView``s (no ``DataLoader``: the engine's parallelism is
its event loop) behind a thin wrapper that follows the trainer's epoch and
carries the data position: Lightning saves a loader's ``state_dict()`` in
the checkpoint with the model and hands it back to ``load_state_dict`` on
``trainer.fit(ckpt_path=...)``, so a run resumed mid-epoch yields exactly
the batches the interrupted one had not (at another world size too).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..dataset import InSituDataset
from ..io.geometry import ArrayGeometry
from ..io.group import open_geometries
from ..plan.splits import SplitManifest, split_by_chunk
from ..validation import Anything, Instance, Table, validate_params
from ..views import DatasetView
from .torch import TorchView

__all__ = ["InSituDataModule"]

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule as _DataModuleBase
else:
    try:  # lightning is an optional extra: without it the name still imports, and the module says what to install
        from lightning.pytorch import LightningDataModule as _DataModuleBase
    except ImportError:  # pragma: no cover
        _DataModuleBase = object

# a manifest, or the fractions split_by_chunk assigns chunks by (None: its default fractions)
Splits = SplitManifest | Sequence[float] | Mapping[str, float] | None
_ENDED = object()  # a pass that yielded fewer batches than planned (a dataset closed under it)


class SplitLoader:
    """A split's ``TorchView`` as Lightning iterates it: the trainer's epoch, the consumer's position.

    A loaded state resumes its epoch where the consumer stopped. One whose
    epoch was done (a checkpoint after an epoch's last batch, which Lightning
    resumes by iterating the same loader on) or is behind the trainer's
    starts the next epoch at its beginning. A pass ends as its last batch is
    handed over: Lightning stops asking at ``len()`` and validates meanwhile,
    and an open pass would hold its chunks through the validation pass.
    """

    def __init__(self, view: TorchView, epoch: Callable[[], int | None]) -> None:
        self.view = view
        self._epoch = epoch  # the trainer's current epoch; None for evaluation loaders (their order has none)
        self._pending: Mapping[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.view)

    def __iter__(self) -> Iterator[Any]:
        # the epoch and a loaded state are read at the first item, not here: Lightning may make the iterator
        # before it restores a checkpoint (``trainer.estimated_stepping_batches`` in ``configure_optimizers``)
        epoch = self._epoch()
        pending, self._pending = self._pending, None
        if pending is not None:
            left = self._resume(pending, epoch)
        else:
            if epoch is not None:
                self.view.view.set_epoch(epoch)
            left = len(self.view)
        items = iter(self.view)
        for k in range(left):
            item = next(items, _ENDED)
            if item is _ENDED:
                return
            if k == left - 1 and isinstance(items, Generator):
                items.close()  # the pass ends now (its last batch stays valid): nothing waits for the next call
            yield item

    def _resume(self, state: Mapping[str, Any], epoch: int | None) -> int:
        """Load ``state`` into the view, or the next epoch's start where it is spent; the batches left."""
        view = self.view.view
        self.view.load_state_dict(state)  # a state of another pass raises here, naming the difference
        at = view.state_dict()  # the resume point (a saved world size's consumed batches folded into history)
        history = tuple((int(w), int(k)) for w, k in at["history"])
        n = view.planner.plan(view.split, at["epoch"], history).n_batches
        if at["batches_consumed"] < n and (epoch is None or at["epoch"] >= epoch):
            return n - at["batches_consumed"]
        following = max(at["epoch"] + 1, epoch if epoch is not None else 0)
        self.view.load_state_dict({**at, "epoch": following, "batches_consumed": 0, "history": []})
        return view.planner.plan(view.split, following).n_batches

    def state_dict(self) -> dict[str, Any]:
        """The view's position at the items taken (``TorchView.state_dict``), or a loaded one not yet used."""
        return dict(self._pending) if self._pending is not None else self.view.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` when the next iteration is of its epoch (a state of another pass raises then)."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping from state_dict(), got {type(state).__name__}")
        self._pending = dict(state)


# What ``InSituDataModule`` accepts (``validation``); what it hands the dataset, the dataset's own table checks
PARAMETERS: Table = {
    "store": [Anything("InSituDataset, on each process")],
    "variables": [Anything("InSituDataset, on each process")],
    "splits": [Instance(SplitManifest, "a SplitManifest"), Instance((tuple, list, Mapping), "fractions"), None],
    "batch_size": [Anything("InSituDataset's batch_size")],
    "predict_split": [Instance(str, "a split name (str)")],
    "mask_key": [Instance(str, "a str (the key of the padding mask)"), None],
}


class InSituDataModule(_DataModuleBase):
    """A ``LightningDataModule`` over a zarr store: train/val/test/predict loaders, resumable mid-epoch.

    Parameters
    ----------
    store
        A zarr ``Store`` or a URL/path, as ``InSituDataset`` takes it.
    variables
        ``{label: ArrayGeometry}``, array paths, or ``None`` (every array with the sample axis).
    splits
        A ``SplitManifest``, or the fractions ``split_by_chunk`` assigns the
        first variable's chunks by (``None``: its default fractions).
    batch_size
        Samples per batch.
    predict_split
        The split ``predict_dataloader`` yields (sequential, every sample once).
    mask_key
        Put each batch's padding mask (``Batch.padded``) in every item under this key.
    **dataset_options
        Any other ``InSituDataset`` keyword (``shuffle``, ``seed``,
        ``block_chunks``, ``last_batch``, ``cache_dir``, ...). ``rank`` and
        ``world_size`` come from the trainer (``global_rank``, ``world_size``)
        when it has one.

    Raises
    ------
    ImportError
        Lightning is not installed.
    TypeError
        ``splits`` is neither a manifest nor fractions.
    """

    @validate_params(PARAMETERS)
    def __init__(
        self,
        store: Any,
        variables: Mapping[str, ArrayGeometry] | Sequence[str] | None = None,
        *,
        splits: Splits = None,
        batch_size: int = 32,
        predict_split: str = "test",
        mask_key: str | None = None,
        **dataset_options: Any,
    ) -> None:
        if _DataModuleBase is object:  # pragma: no cover - lightning is an optional extra
            raise ImportError("InSituDataModule needs Lightning: pip install 'insitubatch[lightning]'")
        super().__init__()
        self.store = store
        self.variables = variables
        self.splits = splits
        self.batch_size = batch_size
        self.predict_split = predict_split
        self.mask_key = mask_key
        self.dataset_options = dataset_options
        self.dataset: InSituDataset | None = None  # opened in ``setup``, on each process
        self._loaders: dict[str, SplitLoader] = {}
        self._train_state: Mapping[str, Any] | None = None  # from a checkpoint, for the train loader to come

    def _manifest(self) -> SplitManifest:
        if isinstance(self.splits, SplitManifest):
            return self.splits
        if isinstance(self.variables, Mapping):
            geometry = next(iter(self.variables.values()))
        else:
            geometry = next(iter(open_geometries(self.store, variables=self.variables).values()))
        if self.splits is None:
            return split_by_chunk(geometry)
        return split_by_chunk(geometry, fractions=self.splits)

    def setup(self, stage: str) -> None:
        """Open the dataset on this process, at the trainer's rank of its world size (once per fit/test/...)."""
        if self.dataset is not None:
            return
        options = dict(self.dataset_options)
        trainer = self.trainer
        if trainer is not None and "rank" not in options and "world_size" not in options:
            options.update(rank=trainer.global_rank, world_size=trainer.world_size)
        self.dataset = InSituDataset(
            self.store, self._manifest(), self.variables, batch_size=self.batch_size, **options
        )

    def teardown(self, stage: str) -> None:
        """Close the dataset (its passes, pool and cache); the next ``setup`` opens it again."""
        if self.dataset is not None:
            self.dataset.close()
        self.dataset = None
        self._loaders = {}

    def state_dict(self) -> dict[str, Any]:
        """The train loader's position, under ``"train"`` (empty before it exists): Lightning saves it.

        The same position Lightning saves from the loader itself; kept here
        too, so a resume restores it even where Lightning builds the loader
        before it reads the checkpoint and skips the loader's own state.
        """
        loader = self._loaders.get("train")
        if loader is not None:
            return {"train": loader.state_dict()}
        return {"train": dict(self._train_state)} if self._train_state is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the train loader at the saved position (now, or when it is made)."""
        state = state_dict.get("train")
        if state is None:
            return
        loader = self._loaders.get("train")
        if loader is not None:
            loader.load_state_dict(state)
        else:
            self._train_state = dict(state)

    def _loader(self, split: str, *, training: bool = False) -> SplitLoader:
        if self.dataset is None:
            self.setup("fit")
        assert self.dataset is not None
        loader = self._loaders.get(split)
        if loader is None:
            view: DatasetView = self.dataset.split(split)
            loader = SplitLoader(
                TorchView(view, mask_key=self.mask_key), self._trainer_epoch if training else _no_epoch
            )
            if training and self._train_state is not None:
                loader.load_state_dict(self._train_state)
                self._train_state = None
            self._loaders[split] = loader
        return loader

    def _trainer_epoch(self) -> int | None:
        trainer = self.trainer
        return trainer.current_epoch if trainer is not None else None

    def train_dataloader(self) -> SplitLoader:
        """The ``train`` split: shuffled, the trainer's epoch, resumable from a checkpoint mid-epoch."""
        return self._loader("train", training=True)

    def val_dataloader(self) -> SplitLoader:
        """The ``val`` split, in order."""
        return self._loader("val")

    def test_dataloader(self) -> SplitLoader:
        """The ``test`` split, in order."""
        return self._loader("test")

    def predict_dataloader(self) -> SplitLoader:
        """The ``predict_split`` split, in order."""
        return self._loader(self.predict_split)


def _no_epoch() -> None:
    return None
