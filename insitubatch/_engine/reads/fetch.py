"""A pass's reads of a remote store: a key (and an optional byte range) in, its bytes out, whatever the link does.

:meth:`Fetcher.start` begins a read and calls back once with its bytes (or
``None`` for a missing key) or its error; :meth:`Fetcher.get` is the same as
a coroutine. Everything runs on zarr's loop as callbacks, with no task of its
own and no timer handle per read: the first requests of the reads started
in one loop iteration go out as one batch (the backend's
``request_many``), and every attempt's hedge and stall times sit in its
link's one heap (``deadlines.Deadlines``: the passes reading one endpoint
share it), serviced by one loop timer. A read is a loop of attempts
bounded by the store's :class:`~.read_policy.ReadPolicy`, and an attempt is
a race:

* the request goes out; if no answer came after the link's hedge time
  (``StoreLink.hedge_after``: 3 x the recent p90, at least 100 ms) and the
  hedge budget allows (5% of GETs), one duplicate goes out; the first good
  answer wins and the other request is cancelled (its connection closed);
* if no answer came after the stall time (``StoreLink.stall_after``: 10 x
  the recent p99, at least 2 s, at most the store's ``read_timeout``, and
  1.5 x longer at each further stall of the same read), every request of
  the attempt is abandoned and a fresh one starts after the backoff;
* a throttling answer (429/503, S3 ``SlowDown``) tells the link (the auto
  window halves, hedging pauses) and is retried after the backoff; another
  transient failure is retried; a missing key is ``None``; a denied or
  malformed request fails at once, and so does an answer the client
  cannot frame (``read_policy.protocol_fault``) that comes twice running,
  the same both times: the server's way of answering, not a bad moment.
  An S3 404 ``NoSuchBucket`` is an error, never a missing key.

No attempt starts later than ``retry_timeout`` after the first, and a
silent attempt is cut where that window ends (but not before the 2 s
floor), so a key that never answers fails within ``retry_timeout`` + 2 s,
naming the attempts.

A read whose ``size_hint`` is over ``STREAM_OVER_BYTES`` through obstore's
client is a large one: its race ends with the response's first byte, and its body is streamed
with the stall timer on every piece, so a slow large body is never cut
while bytes still arrive. A smaller read is one request for headers and
body together, its stall time stretched by what the body takes at
``SLOW_STREAM_BYTES_PER_S``; the engine's own client takes every read that way,
whatever its size (it reads chunked bodies, which obstore's cannot for a range),
a read over ``STREAM_OVER_BYTES`` with no duplicate and no latency sample
(its time is its body's, not the link's).

A versioned read (:meth:`Fetcher.get_versioned`) also returns the object's
version, its ``ETag`` (a shard's index read), or is conditional on one
(``If-Match``: an inner chunk read through that index); it is one request,
never streamed. Its 412, the object no longer that version, is not retried
and tells the link nothing: the caller reads the object anew.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from zarr.abc.buffer import Buffer
from zarr.abc.store import RangeByteRequest
from zarr.buffer import default_buffer_prototype

from ...stores.read_policy import Outcome, classify, http_status, protocol_fault
from ..stats import PassCounters
from .deadlines import Deadlines
from .store_link import STALL_FLOOR_S, STALL_GROWTH, StoreClient
from .window import WindowUser

__all__ = ["ANY_VERSION", "Fetcher", "Read"]

# A read of more than this many bytes streams its body under the stall timer (a larger one may take
# longer than a stall time to arrive even while every piece comes in time).
STREAM_OVER_BYTES = 8 << 20
# Pieces of a streamed body.
STREAM_PIECE_BYTES = 1 << 20
# A small read's stall time grows by its bytes at this rate: a body that slow is stalled too.
SLOW_STREAM_BYTES_PER_S = 4e6

# The ``version`` of a read that asks for the object's ETag and takes whatever version is there.
ANY_VERSION = ""

Done = Callable[[Buffer | None, BaseException | None], None]


class _Stalled(TimeoutError):
    """No answer within the stall time."""


class Read:
    """One read in progress: attempts until an answer, a missing key or the retry bounds; ``done`` called once.

    An attempt is a race: the request and at most one duplicate; the first
    good answer wins and the rest are cancelled.
    """

    __slots__ = (
        "_big",
        "_deadline",
        "_errors",
        "_fault",
        "_hedge_at",
        "_plain",
        "_racing",
        "_requests",
        "_stall_at",
        "_stall_s",
        "_task",
        "_timer",
        "attempt",
        "byte_range",
        "done",
        "fetcher",
        "first",
        "key",
        "large",
        "learn",
        "loop",
        "size_hint",
        "version",
    )

    def __init__(
        self,
        fetcher: Fetcher,
        key: str,
        byte_range: Any,
        size_hint: int | None,
        done: Done,
        learn: bool = True,
        version: str | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.key = key
        self.byte_range = byte_range
        self.size_hint = size_hint
        self.learn = learn
        self.done: Done | None = done
        loop = fetcher.loop
        assert loop is not None  # (a read starts on the fetcher's loop)
        self.loop: asyncio.AbstractEventLoop = loop
        self.first = self.loop.time()
        self.attempt = 0
        # a large read taken whole (the engine's client): no duplicate of it, and its time is no GET's latency
        self._big = size_hint is not None and size_hint > STREAM_OVER_BYTES
        # None: an ordinary read; ``ANY_VERSION``: answered with the object's ETag too; an ETag: If-Match it
        self.version = version
        self.large = self._big and fetcher.stream_from is not None and version is None
        self._fault = ""  # the last attempt's protocol fault: the same one twice running is not retried again
        self._plain = False  # a whole-key ranged GET the server refused (an empty object): a plain GET instead
        self._stall_s = fetcher.link.stall_after(fetcher.policy)
        self._racing = False  # an attempt's requests are out (its deadlines in the link's heap)
        self._requests: list[tuple[asyncio.Future, float]] = []  # the attempt's request and duplicate, when sent
        self._errors = 0
        self._hedge_at = self._stall_at = math.inf
        self._deadline: list | None = None  # the racing attempt's entry in the link's heap
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Future | None = None

    def cancel(self) -> None:
        """Abandon the read: its requests are cancelled and ``done`` is never called."""
        self.done = None
        self._end_race()
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()

    def step(self, work: Callable[..., None], *args: Any) -> None:
        """Run ``work`` (a step of this read, called back on the loop); a fault in it fails the read.

        Without this, an exception in a loop callback is only logged, and
        whoever awaits the read waits forever.
        """
        try:
            work(*args)
        except Exception as exc:
            self._end_race()
            self.finish(None, exc)

    def finish(self, answer: Any, exc: BaseException | None) -> None:
        """Call ``done`` with the outcome (once: a read cancelled or already finished calls nobody)."""
        done, self.done = self.done, None
        if done is not None:
            done(answer, exc)

    # -- an attempt ------------------------------------------------------------------------------------
    def launch(self) -> asyncio.Future:
        """This attempt's request: a future for the answer (the headers only, for a large read streamed)."""
        backend, key, byte_range = self.fetcher.backend, self.key, self.byte_range
        if self.large:
            return self.fetcher.stream_from.open(key, byte_range)
        if self._plain:
            return backend.whole(key)
        if self.version is not None:
            return backend.versioned(key, byte_range, self.version)
        return backend.request(key, byte_range)

    def prepare(self) -> None:
        """Begin an attempt (its request goes out with ``race``): the retry window's bound on it, the hedge budget."""
        self._timer = None
        self.attempt += 1
        fetcher = self.fetcher
        # a silent attempt never outlasts the retry window by more than the stall floor: a key that never
        # answers fails within retry_timeout + STALL_FLOOR_S, whatever the timer grew to
        left = self.first + fetcher.policy.retry_timeout_s - self.loop.time()
        stall = min(self._stall_s, max(STALL_FLOOR_S, left))
        if not self.large:
            stall += (self.size_hint or 0) / SLOW_STREAM_BYTES_PER_S
        fetcher.link.requested()
        hedge = fetcher.hedge and not (self._big and not self.large)
        self._hedge_at = fetcher.link.hedge_after() if hedge else math.inf  # (relative until ``race``)
        self._stall_at = stall

    def race(self, request: asyncio.Future) -> None:
        """The attempt's request is out: its deadlines go in the link's heap, and its answer comes to ``landed``."""
        now = self.loop.time()
        self._hedge_at += now
        self._stall_at += now
        self._racing = True
        self._errors = 0
        self._requests = [(request, now)]
        request.add_done_callback(self.landed)
        self._deadline = self.fetcher.deadlines.add(min(self._hedge_at, self._stall_at), self, self.attempt)

    def _try(self) -> None:
        self.prepare()
        self.race(self.launch())

    def racing(self, attempt: int) -> bool:
        """Whether attempt number ``attempt`` of this read still races (a deadline of it still counts)."""
        return self._racing and self.attempt == attempt

    def _end_race(self) -> None:
        """End the attempt: every request of it still out is cancelled (the loser, or all of a stalled one)."""
        if not self._racing:
            return
        self._racing = False
        if self._deadline is not None:
            Deadlines.forget(self._deadline)  # a deadline still to come must not keep this read (and its store) alive
            self._deadline = None
        for request, _ in self._requests:
            if not request.done():
                request.cancel()
        self._requests = []

    def landed(self, request: asyncio.Future) -> None:
        """A request of the attempt ended (a done-callback): the first good answer wins it."""
        if not self._racing or request.cancelled():
            return
        try:
            exc = request.exception()
            if exc is None:
                requests = self._requests
                started = requests[0][1] if request is requests[0][0] else requests[1][1]
                hedge_won = request is not requests[0][0]
                self._end_race()
                self._raced(request.result(), self.loop.time() - started, hedge_won, None)
                return
            self._errors += 1
            if self._errors == len(self._requests) or classify(exc) is Outcome.MISSING:
                self._end_race()  # every request failed (a missing key needs no second opinion)
                self._raced(None, 0.0, False, exc)
        except Exception as exc:
            self._end_race()
            self.finish(None, exc)

    def tick(self, now: float) -> None:
        """A deadline of the racing attempt came (the link's heap): the stall ends it, the hedge doubles it."""
        try:
            if now >= self._stall_at:
                self._end_race()
                self._raced(None, 0.0, False, _Stalled())
                return
            if now >= self._hedge_at:
                self._hedge_at = math.inf
                fetcher = self.fetcher
                if len(self._requests) == 1 and fetcher.link.take_hedge(now):
                    fetcher.counters.hedged += 1
                    duplicate = self.launch()
                    self._requests.append((duplicate, self.loop.time()))
                    duplicate.add_done_callback(self.landed)
            self._deadline = self.fetcher.deadlines.add(min(self._hedge_at, self._stall_at), self, self.attempt)
        except Exception as exc:
            self._end_race()
            self.finish(None, exc)

    def _raced(self, answer: Any, seconds: float, hedge_won: bool, exc: BaseException | None) -> None:
        if self.done is None:
            return  # cancelled
        fetcher = self.fetcher
        if exc is None:
            fetcher.counters.hedge_wins += hedge_won
            if self.large or not self._big:
                fetcher.link.latency.add(seconds)
            if self.large:
                self._task = asyncio.ensure_future(_body(answer, self._stall_s))
                self._task.add_done_callback(lambda task: self.step(self._streamed, task, seconds))
                return
            self._answer(answer, seconds)
        else:
            self._failed(exc)

    def _streamed(self, task: asyncio.Future, seconds: float) -> None:
        self._task = None
        if self.done is None or task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._answer(task.result(), seconds)
        else:
            self._failed(exc)

    def _answer(self, answer: Any, seconds: float) -> None:
        fetcher, counters = self.fetcher, self.fetcher.counters
        if self.version is not None:  # (bytes and the object's ETag, or None)
            answer, tag = answer
        nbytes = 0 if answer is None else len(answer)
        counters.gets += 1
        counters.get_bytes += nbytes
        fetcher.window.completed(nbytes, seconds, self.learn)
        # (a zarr store's own get returns a Buffer, or None for a missing key)
        if answer is not None and not isinstance(answer, Buffer):  # obstore's bytes, not copied
            answer = fetcher.prototype.buffer.from_bytes(memoryview(answer))
        self.finish(answer if self.version is None else (answer, tag), None)

    def _failed(self, exc: BaseException) -> None:
        fetcher, policy = self.fetcher, self.fetcher.policy
        if isinstance(exc, _Stalled):
            fetcher.counters.stalls += 1
            exc = TimeoutError(f"no answer for {self.key!r} within {self._stall_s:.1f}s")
            self._stall_s = min(policy.read_timeout_s, self._stall_s * STALL_GROWTH)
        else:
            outcome = classify(exc)
            if outcome is Outcome.MISSING:
                fetcher.counters.gets += 1
                self.finish(None, None)
                return
            if self.byte_range is None and not self._plain and http_status(exc) == 416:
                self._plain = True  # an empty object: nothing for a range to name
                self.attempt -= 1
                self._try()
                return
            if outcome is Outcome.FATAL or (fetcher.backend.own_retries and outcome is Outcome.RETRY):
                self.finish(None, exc)
                return
            if protocol_fault(exc):
                fault = f"{type(exc).__name__}: {exc}"
                if fault == self._fault:
                    elapsed = self.loop.time() - self.first
                    self.finish(None, _give_up(self.key, self.attempt, elapsed, exc, " (the same fault twice running)"))
                    return
                self._fault = fault
            if outcome is Outcome.THROTTLE:
                fetcher.counters.throttled += 1
                fetcher.link.throttled(self.loop.time())
        wait = policy.backoff(self.attempt + 1)
        elapsed = self.loop.time() - self.first
        if self.attempt > policy.max_retries or elapsed + wait > policy.retry_timeout_s:
            self.finish(None, _give_up(self.key, self.attempt, elapsed, exc))
            return
        fetcher.counters.retries += 1
        self._timer = self.loop.call_later(wait, self.step, self._try)


class Fetcher:
    """One pass's reads of one remote store, under the window's permits the caller holds. Loop thread only.

    The first attempts of the reads started in one loop iteration go out
    together, as one ``request_many`` of the backend, at the end of it;
    their hedge and stall times share the link's heap (:class:`~.deadlines.Deadlines`).
    """

    def __init__(self, client: StoreClient, permits: WindowUser, counters: PassCounters, hedge: bool = True) -> None:
        self.client = client
        self.link = client.link
        self.policy = client.policy
        self.backend = client.backend
        # through obstore's client, a large read streams its body under the stall timer (the backend's ``open``,
        # then ``_body``); None: every read is one request
        self.stream_from: Any = self.backend if getattr(self.backend, "streams_large", False) else None
        self.window = permits.window
        self.counters = counters
        self.hedge = hedge
        self.prototype = default_buffer_prototype()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: Deadlines | None = None
        self._outgoing: list[Read] = []  # reads started this loop iteration, their first request not sent yet

    @property
    def deadlines(self) -> Deadlines:
        assert self._deadlines is not None  # (the link's for the loop, taken at the first read on it)
        return self._deadlines

    def start(
        self,
        key: str,
        byte_range: Any,
        size_hint: int | None,
        done: Done,
        learn: bool = True,
        version: str | None = None,
    ) -> Read:
        """Begin reading ``key``; ``done(buffer_or_None, None)`` or ``done(None, error)`` is called once.

        ``byte_range`` is a zarr ``ByteRequest`` or None (the whole key);
        ``size_hint`` about how many bytes the answer holds (a large read
        streams its body); ``learn=False`` marks a read the ``max_inflight="auto"``
        controller counts only as a place it held (a shard index: a round
        trip for a few bytes). The error, once the store's retry bounds are
        spent, names the key and the attempts (``TimeoutError`` when no
        attempt got an answer). ``version`` makes it a versioned read
        (:meth:`get_versioned`), whose ``done`` gets ``(bytes, etag)``.
        Call ``cancel()`` on the result to abandon it.
        The request goes out at the end of this loop iteration, with the
        other reads started in it.
        """
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # the first read (or a fetcher used on another loop since)
            self.loop, self._deadlines, self._outgoing = loop, self.link.deadlines(loop), []
        if size_hint is None and isinstance(byte_range, RangeByteRequest):
            size_hint = byte_range.end - byte_range.start
        read = Read(self, key, byte_range, size_hint, done, learn, version)
        read.prepare()
        if not self._outgoing:
            self.loop.call_soon(self._send)
        self._outgoing.append(read)
        return read

    def _send(self) -> None:
        """Send the first requests of the reads started this iteration (one ``request_many``; a large one alone)."""
        reads, self._outgoing = [read for read in self._outgoing if read.done is not None], []  # (not cancelled)
        plain = [read for read in reads if not read.large and read.version is None]
        try:
            requests = self.backend.request_many([(read.key, read.byte_range) for read in plain]) if plain else []
        except Exception:  # (a dead runtime, a bad key): each read meets its own fault alone
            requests = []
            plain = []
        for read, request in zip(plain, requests):
            read.race(request)
        for read in reads:
            if not read.racing(read.attempt):
                read.step(lambda read=read: read.race(read.launch()))

    async def get(
        self, key: str, byte_range: Any = None, size_hint: int | None = None, learn: bool = True
    ) -> Buffer | None:
        """:meth:`start` as a coroutine: the bytes of ``key``, or None if it does not exist; raises the error."""
        return await self._outcome(key, byte_range, size_hint, learn, None)

    async def _outcome(self, key: str, byte_range: Any, size_hint: int | None, learn: bool, version: str | None) -> Any:
        """Loop: what ``done`` of :meth:`start`'s read gets, awaited; a cancelled caller cancels the read."""
        outcome = asyncio.get_running_loop().create_future()

        def done(answer: Buffer | None, exc: BaseException | None) -> None:
            if outcome.done():
                return
            if exc is not None:
                outcome.set_exception(exc)
            else:
                outcome.set_result(answer)

        read = self.start(key, byte_range, size_hint, done, learn, version)
        try:
            return await outcome
        except asyncio.CancelledError:
            read.cancel()
            raise

    async def get_versioned(
        self,
        key: str,
        byte_range: Any = None,
        version: str = ANY_VERSION,
        size_hint: int | None = None,
        learn: bool = True,
    ) -> tuple[Buffer | None, str | None]:
        """The bytes of ``key`` (None if it does not exist) and its ETag (None if the store sent none).

        ``version=ANY_VERSION`` reads whatever version is there; an ETag
        reads only that version (``If-Match``): another raises the store's
        412 error at once (``read_policy.changed``), never retried.
        """
        answer = await self._outcome(key, byte_range, size_hint, learn, version)
        return (None, None) if answer is None else answer


async def _body(result: Any, stall_s: float) -> bytes:
    """A response's body, piece by piece; raises ``_Stalled`` when no piece comes for ``stall_s``."""
    pieces: list[Any] = []
    stream = result.stream(min_chunk_size=STREAM_PIECE_BYTES)
    while True:
        try:
            piece = await asyncio.wait_for(stream.__anext__(), stall_s)
        except StopAsyncIteration:
            return b"".join(pieces)
        except TimeoutError:
            raise _Stalled() from None
        pieces.append(piece)


def _give_up(key: str, attempts: int, elapsed: float, error: BaseException, why: str = "") -> OSError:
    what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    message = f"gave up on {key!r} after {attempts} attempt(s) in {elapsed:.1f}s{why}; the last: {what}"
    return TimeoutError(message) if isinstance(error, TimeoutError) else OSError(message)
