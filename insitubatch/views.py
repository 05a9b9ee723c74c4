"""Views: one split of a dataset (or an inference range) as an iterable of batches.

A view plans its epoch (this rank's share of it, from the dataset's
``EpochPlanner``), starts passes on the dataset's ``PassContext``, and can
save and restore where it stands (``state_dict``/``load_state_dict``), so a
preempted job resumes without re-reading what it consumed.

A view belongs to the process that opened its dataset: it refuses to be
pickled, indexed (torch's ``DataLoader`` indexes what is not an
``IterableDataset``) or iterated in another process, with one message
(:data:`OTHER_PROCESS_MESSAGE`) that every adapter's view gives too.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from ._engine.passes.batch import Batch
from ._engine.passes.context import PassContext
from ._engine.passes.producer import PassIterator, PassState
from ._engine.stats import PassStats
from .io.geometry import ArrayGeometry
from .plan.cost import empty_split_note
from .plan.epoch import EpochPlan
from .plan.planner import EpochPlanner, History
from .validation import Anything, Interval, positive_int, validate_params

__all__ = ["OTHER_PROCESS_MESSAGE", "DatasetView", "InferView"]

STATE_FORMAT = 1

# Why a view (bare, as_torch, to_jax) is not pickled or used in DataLoader workers: said once, for all of them.
OTHER_PROCESS_MESSAGE = (
    "insitubatch views cannot be pickled or used in another process, such as DataLoader worker processes "
    "(num_workers > 0, fork or spawn) or a multiprocessing worker: the engine's parallelism is one event loop "
    "with a shared chunk pool in the process that opened the dataset, and a worker would duplicate the pool "
    "and re-read every chunk. Iterate the view in that process, e.g. "
    "DataLoader(insitubatch.as_torch(view), batch_size=None, num_workers=0), and raise max_inflight instead; "
    "a worker process that needs batches of its own opens its own InSituDataset."
)

logger = logging.getLogger("insitubatch")


class DatasetView:
    """One split of a dataset: iterate it for batches; ``len()`` is batches this epoch.

    ``state_dict()``/``load_state_dict()`` make a pass resumable: a new
    process that loads the state yields exactly the batches the first one
    would have yielded next, and fetches only what those batches need.
    """

    def __init__(self, context: PassContext, planner: EpochPlanner, split: str, *, dataset: Any = None) -> None:
        self.context = context
        self.planner = planner
        self.dataset = dataset  # the InSituDataset that made this view (views read only context and planner)
        self.split = split
        self._pass: weakref.ref[PassState] | None = None
        # (epoch, batch, history) where the next pass starts, set by load_state_dict
        self._resume_at: tuple[int, int, tuple[tuple[int, int], ...]] | None = None
        self._last_stats: PassStats | None = None
        self._pid = os.getpid()  # the process whose engine this view's passes run on
        # (epoch, batches consumed, history) of this view's latest pass once it ended: a pass nobody holds
        # is collected, and a checkpoint taken after it (at an epoch's end, after a ``break``) still knows it
        self._ended_at: tuple[int, int, History] | None = None

    @property
    def batch_size(self) -> int:
        return self.planner.batch_size

    def __getstate__(self) -> dict:
        raise TypeError(OTHER_PROCESS_MESSAGE)

    def __getitem__(self, index: object) -> NoReturn:
        # torch's DataLoader indexes a dataset that is not an IterableDataset, in its workers too
        if os.getpid() != self._pid:
            raise RuntimeError(OTHER_PROCESS_MESSAGE)
        raise TypeError(
            f"a {type(self).__name__} is iterated, not indexed (view[{index!r}]): `for batch in view`, or for "
            "torch DataLoader(insitubatch.as_torch(view), batch_size=None, num_workers=0)"
        )

    @property
    def geometries(self) -> dict[str, ArrayGeometry]:
        """Each label's geometry after chunk transforms (batch rows are ``(*inner_shape,)`` of ``dtype``)."""
        return dict(self.context.outputs)

    @validate_params({"epoch": [Interval(0)]})
    def set_epoch(self, epoch: int) -> None:
        self.context.set_epoch(epoch)

    def plan(self) -> EpochPlan:
        return self.planner.plan(self.split, self.context.epoch)

    def __len__(self) -> int:
        return self.plan().n_batches

    def __iter__(self) -> Iterator[Batch]:
        start: int = 0
        history: History = ()
        if self._resume_at is not None:
            epoch, start, history = self._resume_at
            self._resume_at = None
            self.set_epoch(epoch)
        return self.iterate(start, history=history)

    @validate_params(
        {"start_batch": [Interval(0)], "history": [Anything("load_state_dict: [world_size, batches] segments")]}
    )
    def iterate(self, start_batch: int = 0, *, history: tuple[tuple[int, int], ...] = ()) -> PassIterator:
        """Start a pass at batch ``start_batch`` of the current epoch."""
        ctx = self.context
        if os.getpid() != self._pid:  # a forked child: the dataset's threads and loop stayed in the parent
            raise RuntimeError(OTHER_PROCESS_MESSAGE)
        ctx.check_open()
        plan = self._plan_for_pass(history)
        why = self.planner.empty_reason(self.split, plan)
        if why is not None:  # never a silently empty loop, unless the split was asked to be empty
            logger.warning("insitubatch: %s", empty_split_note(self.split, why))
        state = PassState(ctx, self.split, plan, ctx.epoch, start_batch)
        state.history = history
        ref = weakref.ref(state)
        state.on_stats = self._pass_ended(ref)
        ctx.passes.add(state)
        self._pass = ref
        state.start()
        return PassIterator(state, starter=self)

    def _plan_for_pass(self, history: History = ()) -> EpochPlan:
        return self.planner.plan(self.split, self.context.epoch, history)

    def _pass_ended(self, ref: weakref.ref[PassState]) -> Callable[[PassStats], None]:
        """What a pass tells when it ends: its final stats, and where its consumer stopped."""

        def ended(stats: PassStats) -> None:
            self._last_stats = stats
            state = ref()
            if state is not None and self._pass is ref:  # an older pass ending late does not move the position
                self._ended_at = (state.epoch, state.consumed, state.history)

        return ended

    @property
    def last_pass(self) -> PassStats | None:
        """Stats of this view's latest pass: live while it runs, final once it ended; ``None`` before any."""
        state = self._pass() if self._pass is not None else None
        if state is not None and not state.closed:
            return state.stats()
        return self._last_stats

    # -- resume -------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return self.planner.identity(self.split)

    def state_dict(self) -> dict[str, Any]:
        """Where this view stands: a small JSON-able dict (epoch, batches consumed, identity).

        All ranks of a job consume in lockstep, so one rank's state describes
        the job; ``world_size`` and ``history`` let a different world size resume it.
        """
        history: tuple[tuple[int, int], ...] = ()
        if self._resume_at is not None:
            epoch, consumed, history = self._resume_at
        else:
            state = self._pass() if self._pass is not None else None
            if state is not None and state.epoch == self.context.epoch:
                epoch, consumed, history = state.epoch, state.consumed, state.history
            elif self._ended_at is not None and self._ended_at[0] == self.context.epoch:
                epoch, consumed, history = self._ended_at
            else:
                epoch, consumed = self.context.epoch, 0
        return {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "batches_consumed": consumed,
            "world_size": self.planner.world_size,
            "history": [list(h) for h in history],
            **self._identity(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next pass starts at the saved epoch and batch.

        Raises
        ------
        ValueError
            The state came from a different split, seed, batch size, block
            size, shuffle setting or manifest (each named), or is malformed.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping from state_dict(), got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"state['format']={state.get('format')!r} is not the supported {STATE_FORMAT}; "
                "pass a dict that state_dict() returned"
            )
        mine = self._identity()
        diffs = [f"{k}: saved {state.get(k)!r}, this dataset has {v!r}" for k, v in mine.items() if state.get(k) != v]
        if diffs:
            raise ValueError("cannot resume from a state of a different pass: " + "; ".join(diffs))
        epoch = positive_int("state['epoch']", state.get("epoch"), minimum=0)
        consumed = positive_int("state['batches_consumed']", state.get("batches_consumed"), minimum=0)
        saved_world = positive_int("state['world_size']", state.get("world_size", 1))
        try:
            history = tuple((int(w), int(k)) for w, k in state.get("history", ()))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"state['history']={state.get('history')!r} must be a list of [world_size, batches]"
            ) from exc
        if saved_world != self.planner.world_size:
            # another world size: the consumed part becomes history, the rest is dealt anew
            if consumed:
                history = (*history, (saved_world, consumed))
            consumed = 0
        else:
            saved_n = self.planner.plan(self.split, epoch, history).n_batches
            if consumed > saved_n:
                raise ValueError(f"state['batches_consumed']={consumed} exceeds the {saved_n} batches of epoch {epoch}")
        self._resume_at = (epoch, consumed, history)


class InferView(DatasetView):
    """A sequential pass over an anchor range, across splits; batches carry ``coords``."""

    def __init__(
        self,
        context: PassContext,
        planner: EpochPlanner,
        sample_range: tuple[int, int],
        batch_size: int,
        *,
        dataset: Any = None,
    ) -> None:
        super().__init__(context, planner, "__infer__", dataset=dataset)
        self.sample_range = sample_range
        self._batch_size = batch_size
        self._plan: EpochPlan | None = None

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def plan(self) -> EpochPlan:
        if self._plan is None:
            self._plan = self.planner.make(self.split, 0, (), self.sample_range, self._batch_size)
        return self._plan

    def _plan_for_pass(self, history: History = ()) -> EpochPlan:
        return self.plan()

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "batch_size": self._batch_size, "sample_range": list(self.sample_range)}
