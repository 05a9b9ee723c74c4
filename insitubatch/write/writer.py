"""``SlotWriter``: one worker's validated, claimed writes into its slot range."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store

from ..errors import WriteIntentRangeError
from .claims import DEFAULT_HEARTBEAT_S, DEFAULT_STALE_AFTER_S, CoverageRecord, SlotClaim
from .layout import WriteLayout, read_layout
from .slots import ENV_PLAN, ENV_STORE, SlotPlan
from .tasks import assigned_ranges

__all__ = ["SlotWriter"]

logger = logging.getLogger(__name__)


def _open_writable(url: str) -> Store:
    from ..io.stores import obstore_store

    return obstore_store(url, read_only=False)


class SlotWriter:
    """Write one slot range ``[start, stop)`` of an output group, and nothing else.

    Opening (``with`` or :meth:`open`) validates the range against the layout
    and takes an atomic claim on it, refreshed by a heartbeat thread. Every
    :meth:`write` is checked against the range before a byte is written. A
    clean exit records the range as completed, then releases the claim; an
    exception releases the claim without recording anything; a crash leaves a
    claim that goes stale after ``stale_after_s``.

    One writer belongs to one thread; write each range through one writer.

    Parameters
    ----------
    store
        Writable zarr store holding the group (``LocalStore``, ``ObjectStore``
        or ``MemoryStore``: stores that can create a record atomically).
    start, stop
        The half-open range; both ends on the layout's alignment, except
        ``stop`` at the array end (a partial final chunk).
    group
        Path of the output group.
    worker_id
        Name recorded in the claim and coverage; defaults to ``"<host>:<pid>"``.
    heartbeat_s
        Seconds between claim heartbeats.
    stale_after_s
        Seconds without a heartbeat after which others may treat the claim as dead.
    force
        Write even over other claims or completed coverage (overwriting the
        coverage record). Only when the other writers are known to be dead.
    take_over_stale
        Replace stale overlapping claims instead of refusing.
    clock
        Unix seconds now, for the claim's timestamps and staleness; tests pass
        a manual clock to age a claim without sleeping.

    Raises
    ------
    SlotAlignmentError
        On open: the range is negative, empty, past the extent or unaligned
        (the message names the nearest aligned range).
    WriteClaimError
        On open: another claim or completed coverage overlaps the range, or
        the store cannot create atomically.
    """

    def __init__(
        self,
        store: Store,
        start: int,
        stop: int,
        *,
        group: str = "",
        worker_id: str | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        force: bool = False,
        take_over_stale: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.start = start
        self.stop = stop
        self.group = group.strip("/")
        self.worker_id = worker_id
        self._claim_options: dict[str, Any] = {
            "heartbeat_s": heartbeat_s,
            "stale_after_s": stale_after_s,
            "force": force,
            "take_over_stale": take_over_stale,
            "clock": clock,
        }
        self._force = force
        self._layout: WriteLayout | None = None
        self._claim: SlotClaim | None = None
        self._arrays: dict[str, zarr.Array] = {}
        self.coverage: CoverageRecord | None = None

    @classmethod
    def from_env(
        cls,
        store: Store | str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        plan: SlotPlan | None = None,
        **options: Any,
    ) -> SlotWriter:
        """A writer for the range the environment assigns (see :func:`assigned_ranges`).

        Parameters
        ----------
        store
            The store, or its URL; defaults to ``INSITUBATCH_STORE``, then the
            plan's ``store_url``. URLs open with ``insitubatch.io.stores.obstore_store``.
        env
            Environment to read; defaults to ``os.environ``.
        plan
            The plan, when tasks find their range by scheduler index and no
            ``INSITUBATCH_SLOT_PLAN`` file is set.
        **options
            Further :class:`SlotWriter` keyword arguments.

        Raises
        ------
        KeyError
            No range, or no store, in the environment.
        ValueError
            The task is assigned several ranges (fewer tasks than ranges): use
            :func:`assigned_ranges` and one writer per range.
        """
        env = os.environ if env is None else env
        ranges, group = assigned_ranges(plan, env)
        if len(ranges) != 1:
            raise ValueError(
                f"this task is assigned {len(ranges)} ranges {[(r.start, r.stop) for r in ranges]}; "
                "iterate insitubatch.write.assigned_ranges() and open one SlotWriter per range"
            )
        if store is None:
            if plan is None and ENV_PLAN in env:
                plan = SlotPlan.load(env[ENV_PLAN])  # the saved plan records the store it was made for
            store = env.get(ENV_STORE) or (plan.store_url if plan is not None else None)
            if store is None:
                raise KeyError(f"no store given: pass store=, or set {ENV_STORE} to its URL")
        if isinstance(store, str):
            store = _open_writable(store)
        options.setdefault("group", group)
        return cls(store, ranges[0].start, ranges[0].stop, **options)

    # -- lifecycle --------------------------------------------------------
    def open(self) -> SlotWriter:
        """Validate the range and take the claim (done by ``with``)."""
        if self._claim is not None:
            return self
        layout = read_layout(self.store, self.group)
        layout.check_range(self.start, self.stop)
        self._layout = layout
        self._claim = SlotClaim.acquire(
            self.store,
            self.start,
            self.stop,
            group=self.group,
            worker_id=self.worker_id,
            **self._claim_options,
        )
        return self

    def complete(self) -> CoverageRecord:
        """Record the range as completed and release the claim (done by a clean ``with`` exit)."""
        claim = self._require_claim()
        self.coverage = claim.complete(force=self._force)
        return self.coverage

    def close(self) -> None:
        """Release the claim without recording coverage. Idempotent."""
        if self._claim is not None:
            self._claim.release()

    def __enter__(self) -> SlotWriter:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.complete()
            return
        try:
            self.close()
        except Exception as close_error:  # keep the caller's exception; the claim just goes stale
            logger.warning("could not release the claim on [%d, %d): %s", self.start, self.stop, close_error)

    @property
    def layout(self) -> WriteLayout:
        """The group's layout (read when the writer opened)."""
        self._require_claim()
        assert self._layout is not None
        return self._layout

    def _require_claim(self) -> SlotClaim:
        if self._claim is None:
            raise RuntimeError("the SlotWriter is not open: use `with SlotWriter(...) as w:` or w.open()")
        return self._claim

    # -- writes -----------------------------------------------------------
    def check_write(self, array: str, index_range: tuple[int, int] | slice, data: Any) -> tuple[int, int, np.ndarray]:
        """Validate a write intent without writing; returns ``(start, stop, data)``.

        Raises
        ------
        WriteIntentRangeError
            The array is not indexed, or the index range leaves ``[start, stop)``.
        ValueError
            ``data``'s shape does not fit the selection.
        """
        self._require_claim()
        layout = self.layout
        try:
            spec = layout.array(array)
        except KeyError:
            raise WriteIntentRangeError(
                f"array={array!r} is not an indexed array of group={self.group!r}; slot writers write "
                f"only {layout.names} (other arrays are written once by the coordinator)"
            ) from None
        if isinstance(index_range, slice):
            if index_range.step not in (None, 1) or index_range.start is None or index_range.stop is None:
                raise WriteIntentRangeError(
                    f"index_range={index_range!r} must be a slice with explicit start and stop and step 1"
                )
            index_range = (index_range.start, index_range.stop)
        lo, hi = (int(i) for i in index_range)
        if not (self.start <= lo <= hi <= self.stop):
            raise WriteIntentRangeError(
                f"write to {array!r} at [{lo}, {hi}) leaves this writer's slot [{self.start}, {self.stop}); "
                "nothing was written"
            )
        data = np.asarray(data)
        expected = spec.shape[: spec.axis] + (hi - lo,) + spec.shape[spec.axis + 1 :]
        if data.shape != expected:
            raise ValueError(
                f"data for {array!r} at [{lo}, {hi}) has shape {data.shape}; expected {expected} "
                f"(the full array along every axis but the index axis {spec.axis})"
            )
        return lo, hi, data

    def write(self, array: str, index_range: tuple[int, int] | slice, data: Any) -> None:
        """Write ``data`` to ``array`` at ``index_range`` along its index axis.

        The intent is checked against the slot range and the claim before
        anything is written.

        Parameters
        ----------
        array
            Name of an indexed array of the group.
        index_range
            ``(start, stop)`` or ``slice(start, stop)`` along the index axis,
            inside the writer's range.
        data
            Values covering every other axis in full.

        Raises
        ------
        WriteIntentRangeError
            The write leaves the range (nothing written).
        WriteClaimError
            The claim was lost (cleared as stale or taken over).
        ValueError
            ``data``'s shape does not fit.
        """
        lo, hi, values = self.check_write(array, index_range, data)
        self._require_claim().check()
        if hi == lo:
            return
        spec = self.layout.array(array)
        target = self._arrays.get(array)
        if target is None:
            target = zarr.open_array(self.store, path=_join(self.group, array), mode="r+")
            self._arrays[array] = target
        selection = (slice(None),) * spec.axis + (slice(lo, hi),)
        target[selection] = values

    @property
    def lost(self) -> str | None:
        """Why the claim was lost, or ``None``."""
        return None if self._claim is None else self._claim.lost

    def __repr__(self) -> str:
        return f"SlotWriter(group={self.group!r}, start={self.start}, stop={self.stop})"


def _join(group: str, name: str) -> str:
    return f"{group}/{name}" if group else name
