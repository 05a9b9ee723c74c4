"""The Lightning DataModule: a real ``Trainer`` on the CPU, interrupted mid-epoch and resumed from its checkpoint.

The data holds each sample's index (``x[i] == i``): the batches a model saw
name their samples. An uninterrupted run is the oracle for the interrupted
one plus its resumption.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from insitubatch import InSituDataModule, as_torch, open_geometries, split_by_chunk

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

# the module offers every loader; these models train without a validation_step, which Lightning remarks on
# Lightning 2.6 still calls torch's LeafSpec, which torch 2.13 deprecates: noise we do not own
pytestmark = [
    pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
    # a resumed run writes its checkpoints beside the one it resumed from, as users do
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
]

N = 100
BATCH = 6
PER_EPOCH = -(-N // BATCH)  # 17 batches, the last of 4
SEED = 23


@pytest.fixture
def path(tmp_path):
    root = zarr.open_group(tmp_path / "l.zarr", mode="w")
    x = np.repeat(np.arange(N, dtype="f4")[:, None], 3, axis=1)
    root.create_array("x", shape=x.shape, chunks=(8, 3), dtype="f4", dimension_names=("time", "c"))[:] = x
    return str(tmp_path / "l.zarr")


class Tiny(L.LightningModule):
    """A linear model that records the samples of every batch it trains on."""

    def __init__(self, schedule: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: list[list[int]] = []
        self.schedule = schedule  # a scheduler sized by the run, as OneCycleLR is

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["x"][:, 0].to(torch.int64).tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def predict_step(self, batch, batch_idx):
        return batch["x"][:, 0].to(torch.int64)

    def configure_optimizers(self):
        if self.schedule:  # Lightning makes the train loader's iterator here, before it restores a checkpoint
            assert self.trainer.estimated_stepping_batches == 2 * PER_EPOCH
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Interrupt(L.Callback):
    """Kill the run after ``step`` optimizer steps, as a preemption would (after a later checkpoint's step)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            raise Preempted(f"preempted at step {trainer.global_step}")


class Preempted(RuntimeError):
    pass


def _trainer(root, *callbacks, epochs: int = 2) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=list(callbacks),
    )


def _dm(path, **kw) -> InSituDataModule:
    return InSituDataModule(path, ["x"], splits=(1.0,), batch_size=BATCH, block_chunks=3, seed=SEED, **kw)


@pytest.mark.invariant
@pytest.mark.parametrize("saved, killed", [(5, 8), (PER_EPOCH, PER_EPOCH + 2), (PER_EPOCH + 4, PER_EPOCH + 9)])
def test_a_fit_resumed_from_a_mid_epoch_checkpoint_sees_every_sample_once(path, tmp_path, saved, killed) -> None:
    full = Tiny()
    _trainer(tmp_path / "full").fit(full, datamodule=_dm(path))
    assert len(full.seen) == 2 * PER_EPOCH
    for epoch in (full.seen[:PER_EPOCH], full.seen[PER_EPOCH:]):
        assert sorted(i for b in epoch for i in b) == list(range(N))
    assert full.seen[:PER_EPOCH] != full.seen[PER_EPOCH:]  # each epoch its own order

    ckpts = tmp_path / "ckpt"
    every = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=saved, save_top_k=-1)
    first = Tiny()
    with pytest.raises(Preempted):
        _trainer(tmp_path / "first", every, Interrupt(killed)).fit(first, datamodule=_dm(path))
    assert first.seen == full.seen[:killed]  # the batches after the checkpoint are lost with the process
    (ckpt,) = [p for p in ckpts.iterdir() if f"step={saved}" in p.name]
    loader_state = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    (state,) = loader_state
    epoch = (saved - 1) // PER_EPOCH  # a checkpoint after an epoch's last batch is still that epoch's
    assert (state["epoch"], state["batches_consumed"]) == (epoch, saved - epoch * PER_EPOCH)
    json.dumps(state)  # a plain JSON-able dict

    resumed = Tiny(schedule=True)
    again = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=saved, save_top_k=-1)  # as it was
    _trainer(tmp_path / "second", again).fit(resumed, datamodule=_dm(path), ckpt_path=str(ckpt))
    assert first.seen[:saved] + resumed.seen == full.seen


def test_the_checkpointed_position_resumes_at_another_world_size(path, tmp_path) -> None:
    """A single process's checkpoint, resumed by two ranks (given explicitly, as a trainer would)."""
    every = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=7, save_top_k=-1)
    first = Tiny()
    with pytest.raises(Preempted):
        _trainer(tmp_path / "a", every, Interrupt(9)).fit(first, datamodule=_dm(path))
    (ckpt,) = (tmp_path / "c").iterdir()
    (state,) = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    seen = [i for b in first.seen[:7] for i in b]
    counts = []
    for rank in range(2):
        dm = _dm(path, rank=rank, world_size=2, last_batch="partial", mask_key="padded")
        dm.setup("fit")
        loader = dm.train_dataloader()
        loader.load_state_dict(state)
        items = list(loader)
        counts.append(len(items))
        seen.extend(i for t in items for i in t["x"][~t["padded"], 0].to(torch.int64).tolist())
        dm.teardown("fit")
    assert len(set(counts)) == 1
    assert sorted(seen) == list(range(N)), "a sample was lost or repeated resuming on two ranks"


def test_every_loader_of_the_module(path, tmp_path) -> None:
    """train/val/test/predict from one manifest's splits; predict yields its split in order, every sample once."""
    dm = InSituDataModule(path, ["x"], splits=(0.6, 0.2, 0.2), batch_size=BATCH, seed=SEED)
    trainer = _trainer(tmp_path, epochs=1)
    predictions = trainer.predict(Tiny(), datamodule=dm)
    g = open_geometries(path)["x"]
    test = split_by_chunk(g, fractions=(0.6, 0.2, 0.2)).sample_indices("test").tolist()
    assert torch.cat(predictions).tolist() == test
    dm.setup("fit")
    assert dm.dataset is not None and dm.dataset.rank == 0 and dm.dataset.world_size == 1
    parts = {name: [i for t in getattr(dm, f"{name}_dataloader")() for i in t["x"][:, 0].tolist()]
             for name in ("train", "val", "test")}  # fmt: skip
    assert sorted(int(i) for p in parts.values() for i in p) == list(range(N))
    assert len(dm.train_dataloader()) == len(as_torch(dm.dataset.train))
    dm.teardown("fit")
    assert dm.dataset is None


def test_bad_splits_are_a_type_error(path) -> None:
    with pytest.raises(TypeError, match="splits must be a SplitManifest or fractions, got int"):
        InSituDataModule(path, ["x"], splits=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        InSituDataModule(path, ["x"], splits="train")


def test_a_pass_ends_with_its_last_batch_so_validation_runs_alone(path, caplog) -> None:
    """Lightning stops at ``len()`` and validates with the train iterator still alive: no pass may stay open."""
    dm = InSituDataModule(path, ["x"], splits=(0.6, 0.2, 0.2), batch_size=BATCH, seed=SEED)
    dm.setup("fit")
    train = iter(dm.train_dataloader())
    taken = [next(train) for _ in range(len(dm.train_dataloader()))]  # and no call after the last
    with caplog.at_level("WARNING", logger="insitubatch"):
        assert sum(len(t["x"]) for t in dm.val_dataloader()) == len(dm.dataset.manifest.sample_indices("val"))
    assert not [r for r in caplog.records if "open at once" in r.getMessage()], "the train pass was still open"
    assert dm.train_dataloader().state_dict()["batches_consumed"] == len(taken)
    dm.teardown("fit")


class Ranked(L.LightningModule):
    """Under DDP: each rank appends the real samples of every batch it trains on to its own file."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.out = out

    def training_step(self, batch, batch_idx):
        real = batch["x"][~batch["padded"], 0].to(torch.int64).tolist()
        with open(f"{self.out}/rank{self.global_rank}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps([self.current_epoch, len(batch["x"]), real]) + "\n")
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _ddp(root, *callbacks) -> L.Trainer:
    return L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=list(callbacks),
    )


def _records(out) -> list[list]:
    """Each rank's ``[epoch, rows, real samples]`` per batch, in order."""
    return [[json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in range(2)]


def _each_rank_alone(path, root) -> list[list]:
    """Each rank's uninterrupted two-epoch fit, one in-process trainer per rank given explicitly: the records
    the spawned ranks must reproduce (a fit under ddp_spawn costs two fresh interpreters)."""
    root.mkdir()
    for rank in range(2):
        out = root / f"alone{rank}"
        out.mkdir()
        _trainer(out).fit(Ranked(str(out)), datamodule=_dm(path, mask_key="padded", rank=rank, world_size=2))
        (out / "rank0.jsonl").rename(root / f"rank{rank}.jsonl")
    return _records(root)


@pytest.mark.slow
def test_ddp_ranks_come_from_the_trainer_and_resume_mid_epoch(path, tmp_path) -> None:
    """Two spawned CPU ranks train on their shares (equal batch counts, padding masked); a mid-epoch checkpoint
    resumes exactly on two ranks, and on one.

    The oracle is each rank's fit at its rank given explicitly; the spawned fit and its resumption, with the
    ranks from the trainer, must see exactly its batches.
    """
    full = _each_rank_alone(path, tmp_path / "full")
    assert len(full[0]) == len(full[1]), "ranks ran unequal batch counts"
    for epoch in (0, 1):
        seen = [i for rank in full for e, _, real in rank if e == epoch for i in real]
        assert sorted(seen) == list(range(N)), f"epoch {epoch}: the ranks did not share it exactly"
    per_epoch = len(full[0]) // 2
    saved, killed = per_epoch + 2, per_epoch + 4  # in the second epoch

    ckpts, first = tmp_path / "ckpt", tmp_path / "first"
    first.mkdir()
    every = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=saved, save_top_k=-1)
    with pytest.raises(Exception, match="preempted at step"):
        _ddp(first, every, Interrupt(killed)).fit(Ranked(str(first)), datamodule=_dm(path, mask_key="padded"))
    (ckpt,) = ckpts.iterdir()
    second = tmp_path / "second"
    second.mkdir()
    again = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=saved, save_top_k=-1)
    _ddp(second, again).fit(Ranked(str(second)), datamodule=_dm(path, mask_key="padded"), ckpt_path=str(ckpt))
    for rank, (done, before, after) in enumerate(zip(full, _records(first), _records(second), strict=True)):
        assert before == done[: len(before)], f"rank {rank}'s spawned fit left the oracle's batches"
        assert before[:saved] + after == done, f"rank {rank} did not resume at its step {saved}"
    # the same checkpoint, resumed by one process: the second epoch's rest, dealt to it alone
    alone = tmp_path / "alone"
    alone.mkdir()
    again = L.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=saved, save_top_k=-1)
    _trainer(alone, again).fit(Ranked(str(alone)), datamodule=_dm(path, mask_key="padded"), ckpt_path=str(ckpt))
    rest = [json.loads(line) for line in (alone / "rank0.jsonl").read_text().splitlines()]
    taken = [i for rank in _records(first) for e, _, real in rank[:saved] if e == 1 for i in real]
    assert {e for e, _, _ in rest} == {1}
    assert sorted(taken + [i for _, _, real in rest for i in real]) == list(range(N)), "lost or repeated at 1 rank"
