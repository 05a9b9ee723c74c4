"""``EpochPlanner``: a dataset's order settings, turned into this rank's plan of a split and epoch.

What views need besides the engine context: the plan a pass executes and the
settings that identify it (seed, batch size, block size, shuffle, manifest),
so a saved position only resumes the pass it came from.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from ..io.geometry import ArrayGeometry
from .anchors import AnchorRules, anchor_rules, loss_note, split_losses
from .distributed import LastBatch, rank_streams, resolve_last_batch
from .epoch import EpochPlan, build_plan, epoch_order, valid_anchor_range
from .quarantine import usable_rows
from .splits import SplitManifest

__all__ = ["History", "EpochPlanner"]

# (world_size, batches) segments of an epoch consumed by earlier runs (elastic resume)
History = tuple[tuple[int, int], ...]
# plans kept per planner: a few splits x the current and next epoch; more is a leak over a long run
PLAN_CACHE_SIZE = 8


@dataclasses.dataclass(eq=False)
class EpochPlanner:
    """Plans ``split`` for ``epoch`` on this rank; caches the recent ones."""

    manifest: SplitManifest
    outputs: Mapping[str, ArrayGeometry]  # each label's post-transform geometry
    batch_size: int
    block_chunks: int
    shuffle: bool
    seed: int
    rank: int
    world_size: int
    last_batch: LastBatch | None  # a training pass's last batches (``distributed``); None: pad on several ranks
    release_per_block: bool  # a persisted cache: windowed passes release each block's chunks
    # each label's view before chunk transforms (their dimension names and coordinates give the time axis)
    variables: Mapping[str, ArrayGeometry] | None = None
    _plans: dict[tuple[str, int, History], EpochPlan] = dataclasses.field(default_factory=dict, repr=False)

    @functools.cached_property
    def rules(self) -> AnchorRules:
        """Which anchors the times allow (offsets in time, declared missing dates, frequency): computed once."""
        return anchor_rules(self.manifest, self.variables or self.outputs)

    def losses(self) -> dict[str, dict[str, Any]]:
        """Per split losing anchors to its times: how many per rule, the first times named (``split_losses``)."""
        return split_losses(self.manifest, self.variables or self.outputs, self.rules)

    def plan(self, split: str, epoch: int, history: History = ()) -> EpochPlan:
        """This rank's (cached) plan of ``split`` for ``epoch``, after ``history``."""
        key = (split, epoch, tuple(history))
        plan = self._plans.get(key)
        if plan is None:
            plan = self.make(split, epoch, tuple(history), None, self.batch_size)
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def first_block(self, split: str, epoch: int) -> EpochPlan:
        """This rank's plan of ``split``'s first block alone (not cached): what it reads, in a fraction of the time."""
        return self.make(split, epoch, (), None, self.batch_size, blocks=1)

    def make(
        self,
        split: str,
        epoch: int,
        history: History,
        anchor_range: tuple[int, int] | None,
        batch_size: int,
        blocks: int | None = None,
    ) -> EpochPlan:
        """A fresh plan, of its first ``blocks`` only if given.

        A split the manifest lacks is a sequential pass over ``anchor_range`` (or everything).
        """
        manifest = self.manifest
        shuffle = self.shuffle and split == "train"
        if split not in manifest.names:  # an inference range, or every chunk (``all``): its own sequential "split"
            size = manifest.sample_chunk_size
            if anchor_range is None:
                anchor_range = (0, manifest.n_samples)
            chunks = tuple(range(anchor_range[0] // size, -(-anchor_range[1] // size)))
            manifest = dataclasses.replace(manifest, splits=((split, chunks),))
        training = split == "train"
        # a training pass on one rank is dealt too when its policy changes the end (pad fills it, drop cuts it)
        deal = self.world_size > 1 or bool(history) or (training and self.policy != "partial" and blocks is None)
        eo = epoch_order(
            manifest,
            split,
            self.outputs,
            block_chunks=self.block_chunks,
            shuffle=shuffle,
            seed=self.seed,
            epoch=epoch,
            anchor_range=anchor_range,
            blocks=None if deal else blocks,  # ranks are dealt the whole order
            keep=self.rules.keep,
        )
        order, starts, padded = eo.order, eo.block_starts, None
        if deal:
            mine = rank_streams(
                eo,
                self.world_size,
                batch_size=batch_size,
                last_batch=self.last_batch,
                contiguous=not training,
                history=history,
            )[self.rank]
            order, starts, padded = eo.order[mine.rows], mine.block_starts, mine.padded
        if blocks is not None:
            starts = starts[: blocks + 1]
            order, padded = order[: starts[-1]], None if padded is None else padded[: starts[-1]]
        return build_plan(
            manifest,
            self.outputs,
            order,
            starts,
            batch_size,
            padded=padded if padded is not None and padded.any() else None,
            release_per_block=self.release_per_block,
        )

    @property
    def policy(self) -> LastBatch:
        """The last-batch policy in force at this world size (``None`` resolved)."""
        return resolve_last_batch(self.last_batch, self.world_size)

    def empty_reason(self, split: str, plan: EpochPlan) -> str | None:
        """Why ``plan`` (this rank's of ``split``) yields no sample, as a clause; None when it yields some
        or the split was asked to be empty (a fraction of 0: that is silent)."""
        manifest = self.manifest
        if plan.n_samples or split not in manifest.names or manifest.asked_empty(split):
            return None
        chunks = manifest.chunks(split)
        if not chunks:  # split_by_chunk and split_by_time give every split they were asked for a chunk
            return "its manifest gives it no chunks (was it edited by hand?)"
        samples = manifest.sample_indices(split)
        if not len(samples):
            return f"its {len(chunks)} chunk(s) hold none of the samples its range keeps"
        lo, hi = valid_anchor_range(manifest, self.outputs)
        if not ((samples >= lo) & (samples < hi)).any():
            reach = {label: g.read_offsets for label, g in self.outputs.items() if g.time_rows is None}
            label = max(reach, key=lambda lb: max(max(reach[lb]), -min(reach[lb])))
            return (
                f"its samples {samples[0]} .. {samples[-1]} all lie outside {lo} .. {hi - 1}, the anchors whose "
                f"window (anchor + offset) fits every array (label {label!r} reads {min(reach[label]):+d} .. "
                f"{max(reach[label]):+d}): shorten the offsets, or give the split other chunks"
            )
        offsets = {off for g in self.outputs.values() for off in g.read_offsets}
        inside = samples[(samples >= lo) & (samples < hi)]
        if self.rules.keep is not None and not self.rules.keep[inside].any():
            return f"its times leave it no anchor ({loss_note(split, self.rules.loss(inside).as_dict())})"
        size, excluded = manifest.sample_chunk_size, manifest.excluded_chunks
        if excluded and not usable_rows(inside, excluded, size, manifest.n_samples, offsets).any():
            return (
                f"each of its anchors reads a quarantined chunk ({list(manifest.excluded_chunks)}) through a "
                "label's offset or window: give the split other chunks, or quarantine fewer"
            )
        return (
            f"rank {self.rank} of {self.world_size} is dealt none of its {len(samples)} samples in "
            f"{len(chunks)} chunk(s) (last_batch={self.policy!r}): use fewer ranks or give the split more chunks"
        )

    def identity(self, split: str) -> dict[str, Any]:
        """What a saved position of ``split`` must match to resume here."""
        return {
            "split": split,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "block_chunks": self.block_chunks,
            "shuffle": self.shuffle,
            "manifest": self.manifest.fingerprint(),
        }
