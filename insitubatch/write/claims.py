"""Atomic slot claims with a heartbeat, and the coverage records of completed slots.

A writer owns ``[start, stop)`` by creating the claim record for that exact
range with an atomic create-if-absent (see :mod:`.records`): of any number of
processes racing for one range, exactly one creates it. Claims on different
but overlapping ranges are excluded by a check made *after* creating: each
claimant lists the claims and backs off if any other overlaps its own, so two
overlapping claims can both fail but never both proceed. (This needs listings
that show every completed write, as S3, GCS, Azure and local disks give.)

A thread refreshes the claim's ``heartbeat_at`` every ``heartbeat_s``
(a conditional update, so a claim cleared or taken over in the meantime is
noticed). A claim whose heartbeat is older than its ``stale_after_s`` belongs
to a dead worker; it is cleared only explicitly (:func:`clear_stale_claims`,
``insitubatch write-status --clear-stale``, or ``take_over_stale=True``).

When a slot is finished its writer records *coverage* (one record per
completed range) and then deletes its claim, so at every moment a range is
either claimed, covered, or free.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from zarr.abc.store import Store

from ..errors import WriteClaimError
from ._intervals import Interval, overlaps
from .records import RecordStore, Version

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_STALE_AFTER_S",
    "ClaimInfo",
    "CoverageRecord",
    "SlotClaim",
]

logger = logging.getLogger(__name__)

# How often a writer refreshes its claim: one small PUT per interval per writer.
DEFAULT_HEARTBEAT_S = 10.0
# Six missed heartbeats: rides out slow store requests and long GC pauses, yet a
# crashed worker's slot is recoverable about a minute after it died.
DEFAULT_STALE_AFTER_S = 60.0
# Tries at creating a claim whose previous holder releases it while we look.
_CREATE_ATTEMPTS = 3
# Zero padding of record names: they sort by position for extents below 10**12.
_NAME_DIGITS = 12

CLAIMS = "claims"
COVERAGE = "coverage"

# Unix seconds now; claims take one so tests can age a claim without sleeping.
Clock = Callable[[], float]
# A claim is live while its holder heartbeats, stale once it stopped for longer than stale_after_s.
ClaimState = Literal["live", "stale"]


def range_name(start: int, stop: int) -> str:
    """Record name of ``[start, stop)``; zero-padded so names sort by position."""
    return f"{start:0{_NAME_DIGITS}d}-{stop:0{_NAME_DIGITS}d}"


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ClaimInfo:
    """One claim record: who holds ``[start, stop)`` and when it last proved alive.

    Times are Unix seconds from the claimant's clock.
    """

    start: int
    stop: int
    token: str
    worker_id: str
    host: str
    pid: int
    claimed_at: float
    heartbeat_at: float
    heartbeat_s: float
    stale_after_s: float

    def age(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat."""
        return (time.time() if now is None else now) - self.heartbeat_at

    def is_stale(self, now: float | None = None) -> bool:
        """Whether the holder missed heartbeats for longer than its ``stale_after_s``."""
        return self.age(now) > self.stale_after_s

    def payload(self) -> dict[str, Any]:
        """The JSON object stored in the record."""
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> ClaimInfo:
        """Parse a stored claim record."""
        try:
            return cls(**{k: payload[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise WriteClaimError(f"malformed claim record {dict(payload)!r}: {exc}") from exc

    def state(self, now: float | None = None) -> ClaimState:
        """``"stale"`` once the holder missed heartbeats for longer than ``stale_after_s``, else ``"live"``."""
        return "stale" if self.is_stale(now) else "live"

    def describe(self, now: float | None = None) -> str:
        """One line for messages: slot, holder, heartbeat age."""
        state = self.state(now)
        return (
            f"[{self.start}, {self.stop}) claimed by {self.worker_id!r} (host {self.host}, pid {self.pid}); "
            f"last heartbeat {self.age(now):.1f}s ago, stale after {self.stale_after_s:g}s: {state}"
        )


@dataclass(frozen=True)
class CoverageRecord:
    """A completed slot range and who completed it."""

    start: int
    stop: int
    worker_id: str
    host: str
    pid: int
    completed_at: float
    token: str

    def payload(self) -> dict[str, Any]:
        """The JSON object stored in the record."""
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> CoverageRecord:
        """Parse a stored coverage record."""
        try:
            return cls(**{k: payload[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise WriteClaimError(f"malformed coverage record {dict(payload)!r}: {exc}") from exc


def _clear_hint(group: str) -> str:
    return (
        f"clear stale claims with `insitubatch write-status URL --group '{group}' --clear-stale` "
        f"or insitubatch.write.clear_stale_claims(store, group={group!r}), or open the writer with "
        "take_over_stale=True"
    )


def _conflict(mine: Interval, other: ClaimInfo, group: str, now: float) -> WriteClaimError:
    if other.is_stale(now):
        advice = _clear_hint(group)
    else:
        advice = "wait for it to finish, or pass force=True only if you know that writer is dead"
    return WriteClaimError(f"cannot claim [{mine[0]}, {mine[1]}): {other.describe(now)}; {advice}")


class SlotClaim:
    """A held claim on ``[start, stop)`` with its heartbeat thread. Made by :meth:`acquire`."""

    def __init__(
        self, claims: RecordStore, coverage: RecordStore, info: ClaimInfo, version: Version, clock: Clock = time.time
    ) -> None:
        self._claims = claims
        self._clock = clock
        self._coverage = coverage
        self.info = info
        self._name = range_name(info.start, info.stop)
        self._version = version
        self._lock = threading.Lock()
        self._lost: str | None = None
        self._last_beat = info.heartbeat_at
        self._stop = threading.Event()
        self._released = False
        self._thread = threading.Thread(target=self._beat, name=f"insitu-claim-{info.start}-{info.stop}", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(
        cls,
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
        clock: Clock = time.time,
    ) -> SlotClaim:
        """Claim ``[start, stop)`` of ``group`` atomically and start heartbeating.

        Parameters
        ----------
        store
            A writable zarr store that can create atomically (``LocalStore``,
            ``ObjectStore``, ``MemoryStore``).
        start, stop
            The half-open range (validated by the caller against the layout).
        group
            Path of the output group.
        worker_id
            Name recorded in the claim; defaults to ``"<host>:<pid>"``.
        heartbeat_s
            Seconds between heartbeats.
        stale_after_s
            Seconds without a heartbeat after which others may treat the claim
            as dead; must exceed ``heartbeat_s``.
        force
            Ignore other claims and completed coverage (overwrite them). Only
            for a writer that knows the others are dead.
        take_over_stale
            Replace stale overlapping claims instead of refusing.
        clock
            Unix seconds now: stamps the claim and its heartbeats and judges
            staleness (the heartbeat *interval* is still real time).

        Raises
        ------
        WriteClaimError
            A live (or, without ``take_over_stale``, stale) claim overlaps the
            range, the range overlaps completed coverage, or the store cannot
            create atomically / is read-only.
        ValueError
            Bad ``heartbeat_s`` / ``stale_after_s``.
        """
        if not heartbeat_s > 0:
            raise ValueError(f"{heartbeat_s=} must be > 0")
        if not stale_after_s > heartbeat_s:
            raise ValueError(f"{stale_after_s=} must be greater than {heartbeat_s=}")
        group = group.strip("/")
        claims = RecordStore(store, group, CLAIMS)
        coverage = RecordStore(store, group, COVERAGE)
        claims.ensure_containers()
        coverage.ensure_containers()
        now = clock()
        info = ClaimInfo(
            start=int(start),
            stop=int(stop),
            token=uuid.uuid4().hex,
            worker_id=worker_id or _default_worker_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            claimed_at=now,
            heartbeat_at=now,
            heartbeat_s=float(heartbeat_s),
            stale_after_s=float(stale_after_s),
        )
        mine = (info.start, info.stop)
        name = range_name(*mine)
        version = cls._create(claims, name, info, group, clock, force=force, take_over_stale=take_over_stale)
        try:
            if not force:
                cls._check_overlaps(claims, coverage, name, mine, group, take_over_stale, clock())
        except BaseException:
            claims.delete(name)
            raise
        return cls(claims, coverage, info, version, clock)

    @staticmethod
    def _create(
        claims: RecordStore,
        name: str,
        info: ClaimInfo,
        group: str,
        clock: Clock,
        *,
        force: bool,
        take_over_stale: bool,
    ) -> Version:
        for _ in range(_CREATE_ATTEMPTS):
            version = claims.create(name, info.payload())
            if version is not None:
                return version
            existing = claims.read(name)
            if existing is None:
                continue  # released between our create and our read: try again
            other = ClaimInfo.from_payload(existing[0])
            now = clock()
            if not (force or (take_over_stale and other.is_stale(now))):
                raise _conflict((info.start, info.stop), other, group, now)
            # Conditional: of two writers taking over the same dead claim, one wins.
            version = claims.replace(name, info.payload(), existing[1])
            if version is None:
                raise WriteClaimError(f"cannot claim [{info.start}, {info.stop}): another writer took it over first")
            logger.warning("took over claim %s", other.describe(now))
            return version
        raise WriteClaimError(
            f"cannot claim [{info.start}, {info.stop}): the claim kept changing hands ({_CREATE_ATTEMPTS} attempts)"
        )

    @staticmethod
    def _check_overlaps(
        claims: RecordStore,
        coverage: RecordStore,
        name: str,
        mine: Interval,
        group: str,
        take_over_stale: bool,
        now: float,
    ) -> None:
        for other_name, payload in claims.payloads().items():
            if other_name == name:
                continue
            other = ClaimInfo.from_payload(payload)
            if not overlaps(mine, (other.start, other.stop)):
                continue
            if take_over_stale and other.is_stale(now):
                logger.warning("clearing overlapping stale claim %s", other.describe(now))
                claims.delete(other_name)
                continue
            raise _conflict(mine, other, group, now)
        for payload in coverage.payloads().values():
            done = CoverageRecord.from_payload(payload)
            if overlaps(mine, (done.start, done.stop)):
                raise WriteClaimError(
                    f"cannot claim [{mine[0]}, {mine[1]}): [{done.start}, {done.stop}) is already "
                    f"completed (by {done.worker_id!r}); completed slots are not rewritten unless "
                    "force=True, or the coverage is cleared with "
                    f"insitubatch.write.clear_coverage(store, {done.start}, {done.stop}, group={group!r})"
                )

    # -- heartbeat ------------------------------------------------------------
    def _beat(self) -> None:
        interval = self.info.heartbeat_s
        while not self._stop.wait(interval):
            now = self._clock()
            beat = ClaimInfo(**{**self.info.payload(), "heartbeat_at": now})
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    version = self._claims.replace(self._name, beat.payload(), self._version)
                except Exception as exc:  # a store hiccup: retry until the claim would look stale
                    if now - self._last_beat > self.info.stale_after_s:
                        self._lost = f"heartbeats failed for {now - self._last_beat:.1f}s (last error: {exc})"
                        return
                    logger.warning("heartbeat for [%d, %d) failed: %s", self.info.start, self.info.stop, exc)
                    continue
                if version is None:
                    self._lost = "its claim record was cleared or taken over by another writer"
                    return
                self._version = version
                self._last_beat = now

    @property
    def lost(self) -> str | None:
        """Why the claim was lost, or ``None`` while it is held."""
        return self._lost

    def check(self) -> None:
        """Raise if the claim was lost (cleared as stale, taken over, heartbeats failing).

        Raises
        ------
        WriteClaimError
            The claim is no longer held; nothing more may be written.
        """
        if self._released:
            raise WriteClaimError(f"the claim on [{self.info.start}, {self.info.stop}) was already released")
        if self._lost is not None:
            raise WriteClaimError(f"lost the claim on [{self.info.start}, {self.info.stop}): {self._lost}")
        silent = self._clock() - self._last_beat
        if silent > self.info.stale_after_s:
            # This process stalled (or its heartbeats failed) long enough for others to see the
            # claim as stale and take it over; writing now could clobber the new owner.
            raise WriteClaimError(
                f"lost the claim on [{self.info.start}, {self.info.stop}): no heartbeat landed for "
                f"{silent:.1f}s, longer than stale_after_s={self.info.stale_after_s:g}"
            )

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        with self._lock:  # wait out a heartbeat in flight
            pass
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _still_mine(self) -> bool:
        current = self._claims.read(self._name)
        return current is not None and current[0].get("token") == self.info.token

    def complete(self, *, force: bool = False) -> CoverageRecord:
        """Record ``[start, stop)`` as completed, then release the claim.

        Parameters
        ----------
        force
            Overwrite an existing coverage record for the same range.

        Raises
        ------
        WriteClaimError
            The claim was lost, or the range was recorded complete meanwhile.
        """
        self.check()
        self._stop_heartbeat()
        if not self._still_mine():
            self._released = True
            raise WriteClaimError(
                f"lost the claim on [{self.info.start}, {self.info.stop}) before completing: "
                "its record was cleared or taken over; the range is not recorded as completed"
            )
        record = CoverageRecord(
            start=self.info.start,
            stop=self.info.stop,
            worker_id=self.info.worker_id,
            host=self.info.host,
            pid=self.info.pid,
            completed_at=self._clock(),
            token=self.info.token,
        )
        if self._coverage.create(self._name, record.payload()) is None:
            if not force:
                self.release()
                raise WriteClaimError(
                    f"[{self.info.start}, {self.info.stop}) was recorded complete by another writer "
                    "while this one held the claim"
                )
            self._coverage.overwrite(self._name, record.payload())
        self.release()
        return record

    def release(self) -> None:
        """Stop heartbeating and delete the claim if it is still ours. Idempotent."""
        if self._released:
            return
        self._released = True
        self._stop_heartbeat()
        if self._still_mine():
            self._claims.delete(self._name)
