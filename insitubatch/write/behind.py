"""``WriteBehind``: a slot writer's writes landing on one background thread while the caller computes.

An inference loop that writes synchronously waits for the store on every
batch. With write-behind the caller hands each validated write over and goes
back to the model; one thread, owned by the writer, makes the writes in the
order they were given. Memory is bounded: at most ``depth`` writes are held
(queued or being written), and a caller that gets that far ahead waits for
the oldest to land (back-pressure). A failed write stops the thread from
making any later one and is raised to the caller at its next call, at
:meth:`flush`, and at :meth:`close` if nobody saw it yet.

The hand-over uses only ``queue.SimpleQueue`` (its ``put``/``get`` are single
C calls): a Ctrl-C that lands while the caller waits can never leave a lock
held that the thread, or a later ``close``, would wait on for ever. The free
places of the queue are tokens in a second such queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from ..errors import WriteBehindError

__all__ = ["WriteBehind"]

# What the thread is handed: a write (its job and a description for errors), a barrier to
# answer once every earlier write landed, or the stop sign.
_Write = tuple[Callable[[], None], str]
_STOP = object()


class WriteBehind:
    """One background thread making writes in order, with at most ``depth`` of them held at once.

    Parameters
    ----------
    depth
        Writes held at most (queued plus the one being written); a caller
        submitting one more waits until the oldest landed.
    name
        The thread's name (shows in tracebacks and ``py-spy``).
    """

    def __init__(self, depth: int, name: str) -> None:
        self.depth = depth  # >= 1: SlotWriter's door checked write_behind
        self._jobs: queue.SimpleQueue[_Write | queue.SimpleQueue[None] | object] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token per free place
        for _ in range(self.depth):
            self._free.put(None)
        self._error: WriteBehindError | None = None  # set by the thread only, once
        self._reported = False  # whether the caller has seen the error
        self._dropping = False  # close(): queued writes are skipped, not made
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], what: str) -> None:
        """Queue ``job`` (one write, described by ``what``); waits while ``depth`` writes are held.

        Raises
        ------
        WriteBehindError
            An earlier write failed (nothing after it was written), or the writer was closed.
        """
        self.raise_error()
        if self._closed:
            raise WriteBehindError(f"write-behind is closed: {what} was not queued")
        self._free.get()  # back-pressure: a token comes back as each write lands
        self._jobs.put((job, what))

    def flush(self) -> None:
        """Wait until every write submitted so far landed; raise the first that failed.

        Raises
        ------
        WriteBehindError
            A write failed; the writes queued after it were not made.
        """
        if not self._closed:
            landed: queue.SimpleQueue[None] = queue.SimpleQueue()
            self._jobs.put(landed)
            landed.get()
        self.raise_error()

    def raise_error(self) -> None:
        """Raise the failed write's error, if one failed (every call raises it again)."""
        if self._error is not None:
            self._reported = True
            raise self._error

    def close(self) -> None:
        """Stop the thread: the write being made finishes, queued ones are dropped. Idempotent.

        Raises
        ------
        WriteBehindError
            A write failed and no earlier call had raised it.
        """
        if self._closed:
            return
        self._closed = True
        self._dropping = True
        self._jobs.put(_STOP)
        self._thread.join()
        if self._error is not None and not self._reported:
            self.raise_error()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            if isinstance(item, queue.SimpleQueue):
                item.put(None)  # a barrier: everything before it has landed (or failed)
                continue
            assert isinstance(item, tuple)
            job, what = item
            try:
                if self._error is None and not self._dropping:
                    job()
            except BaseException as exc:  # handed to the caller; the thread never dies of a write
                error = WriteBehindError(
                    f"the background write to {what} failed ({type(exc).__name__}: {exc}); the writes queued "
                    "after it were not made and the slot will not be recorded complete"
                )
                error.__cause__ = exc
                self._error = error
            finally:
                self._free.put(None)
