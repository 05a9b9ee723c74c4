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

from ..errors import WriteBehindError, WriteIntentRangeError
from ..validation import Anything, Flag, Instance, Interval, IsCallable, Table, validate_params
from .behind import WriteBehind
from .claims import DEFAULT_HEARTBEAT_S, DEFAULT_STALE_AFTER_S, CoverageRecord, SlotClaim
from .fingerprint import LayoutFingerprint
from .layout import WriteLayout, read_layout
from .slots import ENV_PLAN, ENV_STORE, SlotPlan
from .tasks import assigned_ranges

__all__ = ["SlotWriter"]

logger = logging.getLogger(__name__)


def _open_writable(url: str) -> Store:
    from ..stores.obstore_stores import obstore_store

    return obstore_store(url, read_only=False)


# What ``SlotWriter`` accepts (``validation``); the range against the layout and the claim's timings when it opens
PARAMETERS: Table = {
    "store": [Anything("the store of the prepared layout, opened when the writer opens")],
    "start": [Anything("the layout: a slot range inside its length")],
    "stop": [Anything("the layout: a slot range inside its length")],
    "group": [Instance(str, "a str (a path inside the store, '' for its root)")],
    "worker_id": [Instance(str, "a str"), None],
    "heartbeat_s": [Anything("SlotClaim: seconds > 0")],
    "stale_after_s": [Anything("SlotClaim: seconds longer than heartbeat_s")],
    "force": [Flag()],
    "take_over_stale": [Flag()],
    "clock": [IsCallable()],
    "write_behind": [Interval(0)],  # 0: write synchronously
}


class SlotWriter:
    """Write one slot range ``[start, stop)`` of an output group, and nothing else.

    Opening (``with`` or :meth:`open`) validates the range against the layout
    and takes an atomic claim on it, refreshed by a heartbeat thread. Every
    :meth:`write` is checked against the range before a byte is written. A
    clean exit records the range as completed, then releases the claim; an
    exception releases the claim without recording anything; a crash leaves a
    claim that goes stale after ``stale_after_s``.

    With ``write_behind=N`` the writes are made by a background thread the
    writer owns while the caller goes on computing: each is validated (and its
    data copied) at the call, at most ``N`` are held at once (a caller that
    gets further ahead waits), a failed one is raised as
    :class:`~insitubatch.errors.WriteBehindError` at the next call, and the
    range is recorded complete only once every queued write landed. Claims and
    resume work as in the synchronous writer: after a crash nothing of the
    range is recorded, so the range is planned, and written, again.

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
    write_behind
        Writes held in the background at most (queued or being written);
        ``0``, the default, writes synchronously in :meth:`write`.

    Raises
    ------
    SlotAlignmentError
        On open: the range is negative, empty, past the extent or unaligned
        (the message names the nearest aligned range).
    WriteClaimError
        On open: another claim or completed coverage overlaps the range, or
        the store cannot create atomically.
    """

    @validate_params(PARAMETERS)
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
        write_behind: int = 0,
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
        self.write_behind = write_behind
        self._behind: WriteBehind | None = None  # the background writes' thread, from open() to close()
        self._layout: WriteLayout | None = None
        self._fingerprint: LayoutFingerprint | None = None  # what the range was checked against
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
            plan's ``store_url``. URLs open with ``insitubatch.obstore_store``.
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
        fingerprint = LayoutFingerprint.read(self.store, self.group, (self.start, self.stop))
        layout = read_layout(self.store, self.group)
        layout.check_range(self.start, self.stop)
        fingerprint.check_all("while the writer opened")  # the layout read above is the one fingerprinted
        self._layout, self._fingerprint = layout, fingerprint
        self._claim = SlotClaim.acquire(
            self.store,
            self.start,
            self.stop,
            group=self.group,
            worker_id=self.worker_id,
            **self._claim_options,
        )
        if self.write_behind:
            self._behind = WriteBehind(self.write_behind, name=f"insitu-write-behind[{self.start},{self.stop})")
        return self

    def flush(self) -> None:
        """Wait until every write so far landed (write-behind); a synchronous writer has nothing to wait for.

        Raises
        ------
        WriteBehindError
            A background write failed; the writes queued after it were not made.
        """
        if self._behind is not None:
            self._behind.flush()

    def complete(self) -> CoverageRecord:
        """Record the range as completed and release the claim (done by a clean ``with`` exit).

        With write-behind it first waits for every queued write to land; if
        one failed it raises ``WriteBehindError``, releases the claim and
        records nothing. A layout changed since the writer opened raises
        ``LayoutChangedError`` the same way.
        """
        claim = self._require_claim()
        try:
            self.flush()
            self._require_fingerprint().check_all("before recording the slot complete")
        except BaseException:
            self._stop_behind(raise_error=False)
            claim.release()
            raise
        self._stop_behind()
        self.coverage = claim.complete(force=self._force)
        return self.coverage

    def close(self) -> None:
        """Release the claim, recording nothing; queued background writes are dropped. Idempotent.

        Raises ``WriteBehindError`` (after releasing) for a failed background write nobody had seen.
        """
        try:
            self._stop_behind()
        finally:
            if self._claim is not None:
                self._claim.release()

    def _stop_behind(self, raise_error: bool = True) -> None:
        behind, self._behind = self._behind, None
        if behind is None:
            return
        try:
            behind.close()
        except WriteBehindError:
            if raise_error:
                raise

    def __enter__(self) -> SlotWriter:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.complete()  # on a failed background write it raises, with the claim released
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

    def _require_fingerprint(self) -> LayoutFingerprint:
        self._require_claim()
        assert self._fingerprint is not None  # open() sets it before taking the claim
        return self._fingerprint

    @property
    def slot_coord(self) -> np.ndarray | None:
        """The index coordinate's values over this writer's range (what ``at=`` takes), or ``None`` without one."""
        coord = self.layout.coord
        return None if coord is None else coord.values[self.start : self.stop]

    # -- writes -----------------------------------------------------------
    def _at_range(self, at: Any) -> tuple[int, int]:
        """The index range ``at`` (coordinate values, one per index) names, checked against the slot."""
        coord = self.layout.coord
        slot = f"this writer's slot [{self.start}, {self.stop})"
        if coord is None:
            raise WriteIntentRangeError(
                f"at= needs the index axis's coordinate, and group={self.group!r} stores none: create the layout "
                "with LayoutSpec(..., coords={dim: values}), or write by index_range; nothing was written"
            )
        try:
            items, idx = coord.locate(at)
        except (TypeError, ValueError) as exc:
            raise WriteIntentRangeError(f"at=: {exc}; nothing was written") from exc
        if not items:
            return self.start, self.start
        first, last = coord.span(self.start, self.stop)
        for value, i in zip(items, idx.tolist()):
            if i < 0:
                raise WriteIntentRangeError(
                    f"at= value {coord.show(value)} is not in coordinate {coord.name!r} "
                    f"({coord.describe(0, len(coord.values))}); nothing was written"
                )
            if not self.start <= i < self.stop:
                raise WriteIntentRangeError(
                    f"at= value {coord.show(value)} ({coord.name} index {i}) is outside {slot}, whose "
                    f"{coord.name} runs {first} .. {last}; nothing was written"
                )
        if np.any(np.diff(idx) != 1):
            raise WriteIntentRangeError(
                f"at= values must be consecutive, increasing steps of {coord.name!r} (one run of indices), "
                f"got indices {idx.tolist()}; write each run separately; nothing was written"
            )
        return int(idx[0]), int(idx[-1]) + 1

    def check_write(
        self, array: str, index_range: tuple[int, int] | slice | None, data: Any, *, at: Any = None
    ) -> tuple[int, int, np.ndarray]:
        """Validate a write intent without writing; returns ``(start, stop, data)``.

        Raises
        ------
        WriteIntentRangeError
            The array is not indexed; the index range leaves ``[start, stop)``;
            an ``at=`` value is missing from the coordinate, outside the slot,
            or the values are no run of consecutive indices.
        ValueError
            ``data``'s shape does not fit the selection.
        TypeError
            Neither or both of ``index_range`` and ``at``, or no ``data``.
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
        if at is not None and data is None and index_range is not None:
            index_range, data = None, index_range  # write(array, data, at=values): with at=, the data comes second
        if (index_range is None) == (at is None):
            raise TypeError("give index_range=(start, stop) or at=<coordinate values>, exactly one of them")
        if data is None:
            raise TypeError(f"write to {array!r}: data is required")
        if at is not None:
            index_range = self._at_range(at)
        elif isinstance(index_range, slice):
            if index_range.step not in (None, 1) or index_range.start is None or index_range.stop is None:
                raise WriteIntentRangeError(
                    f"index_range={index_range!r} must be a slice with explicit start and stop and step 1"
                )
            index_range = (index_range.start, index_range.stop)
        assert index_range is not None
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

    def write(
        self, array: str, index_range: tuple[int, int] | slice | None = None, data: Any = None, *, at: Any = None
    ) -> None:
        """Write ``data`` to ``array`` at ``index_range``, or at coordinate values ``at``, along its index axis.

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
        at
            In place of ``index_range``: the index coordinate's values (dates
            or numbers, as ``LayoutSpec(coords=...)`` gave them), one per index
            written, consecutive and increasing. A date string names its
            instant (``"2020-01-01T06"`` is 06:00). ``write(array, data, at=values)``
            also reads: with ``at``, the second argument is the data.

        Raises
        ------
        WriteIntentRangeError
            The write leaves the range; an ``at`` value is not in the
            coordinate or lies outside the slot (named, with the slot's first
            and last coordinate); ``at`` values are no run of consecutive
            indices; the layout stores no index coordinate. Nothing is written.
        WriteClaimError
            The claim was lost (cleared as stale or taken over).
        LayoutChangedError
            The array's metadata changed since the writer opened (re-created, resized, deleted).
        WriteBehindError
            An earlier background write failed (``write_behind``): nothing more is written.
        ValueError
            ``data``'s shape does not fit.
        TypeError
            Neither or both of ``index_range`` and ``at``, or no ``data``.
        """
        if self._behind is not None:
            self._behind.raise_error()  # an earlier background write failed: refuse before validating this one
        lo, hi, values = self.check_write(array, index_range, data, at=at)
        self._require_claim().check()
        if hi == lo:
            return
        if self._behind is None:
            self._land(array, lo, hi, values)
            return
        # the caller may reuse its buffer (a batch buffer, a device copy) as soon as this returns
        values = np.array(values, copy=True)
        self._behind.submit(lambda: self._land(array, lo, hi, values), f"{array!r} at [{lo}, {hi})")

    def _land(self, array: str, lo: int, hi: int, values: np.ndarray) -> None:
        """Write checked ``values`` into ``array`` at ``[lo, hi)`` (the caller's thread, or the write-behind one)."""
        self._require_claim().check()  # a claim lost while a write waited in the queue: nothing more lands
        self._require_fingerprint().check(array, f"before writing {array!r} at [{lo}, {hi})")
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
