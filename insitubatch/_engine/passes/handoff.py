"""The bounded hand-over of finished batches from a pass's producer thread to its consumer.

``queue.Queue`` guards its deque with a ``threading.Condition`` whose
``__enter__``/``__exit__`` are Python. A Ctrl-C raised in the consumer as
``__exit__`` starts leaves that lock held for good, and the next put or get
(the pass's own close, at exit) waits for ever. Every step here is a C call
on a ``queue.SimpleQueue``, which leaves no lock held whatever interrupts it.
"""

from __future__ import annotations

import queue
from typing import Any

__all__ = ["Handoff"]


class Handoff:
    """At most ``depth`` batches waiting; one producer thread puts, the consumer gets."""

    __slots__ = ("_items", "_room", "depth")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # wake-ups for a producer waiting for room; at most one kept, a lost one costs the producer a timeout
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()

    def put(self, item: Any, timeout: float) -> bool:
        """Hand ``item`` over once there is room; False if there was none within ``timeout`` seconds."""
        if self._items.qsize() >= self.depth:
            try:
                self._room.get(timeout=timeout)
            except queue.Empty:
                return False
            if self._items.qsize() >= self.depth:  # a stale wake-up: the caller waits again
                return False
        self._items.put(item)
        return True

    def get(self, timeout: float) -> Any:
        """The next item; ``queue.Empty`` if none came within ``timeout`` seconds."""
        item = self._items.get(timeout=timeout)
        if self._room.empty():
            self._room.put(None)
        return item

    def drain(self) -> None:
        """Drop every waiting item (the pass ended) and wake the producer."""
        while True:
            try:
                self._items.get_nowait()
            except queue.Empty:
                break
        if self._room.empty():
            self._room.put(None)

    def qsize(self) -> int:
        return self._items.qsize()

    def empty(self) -> bool:
        return self._items.empty()

    def full(self) -> bool:
        return self._items.qsize() >= self.depth
