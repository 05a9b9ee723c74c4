"""The emulator's fault rules and request counters: what :class:`Emulator` injects and counts.

:class:`EmulatorStats` is also what :class:`EmulatorProcess` reads back from
its child as JSON, so it round-trips through ``to_dict``/``from_dict``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Counters", "EmulatorStats", "Fault", "KeyStats"]

# Default stall: longer than any sensible client timeout in a test.
DEFAULT_STALL_S = 30.0
DEFAULT_RETRY_AFTER_S = 1


@dataclass
class Fault:
    """One injected failure rule; :meth:`Emulator.inject` makes them.

    A GET whose key matches ``key`` (an ``fnmatch`` glob; ``"*"`` is every
    key) fails with probability ``probability``, at most ``times`` times
    (``None``: no limit). ``fired`` counts how often it did.
    """

    kind: str
    key: str = "*"
    probability: float = 1.0
    times: int | None = None
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    stall_s: float = DEFAULT_STALL_S
    fired: int = 0

    def matches(self, key: str) -> bool:
        """Whether this fault applies to ``key`` now: its pattern matches and it is not used up."""
        return (self.times is None or self.fired < self.times) and fnmatch.fnmatchcase(key, self.key)


@dataclass(frozen=True)
class KeyStats:
    """What the server did for one key."""

    gets: int = 0
    heads: int = 0
    bytes_sent: int = 0
    faults: int = 0
    abandoned: int = 0  # requests the client gave up on before the first byte


@dataclass(frozen=True)
class EmulatorStats:
    """A snapshot of the server's counters (control requests excluded).

    ``throttled``, ``held`` and ``stragglers`` count what the link model
    did (503 SlowDown answers, GETs never answered, late answers);
    ``abandoned`` counts requests whose client left before the first byte.
    """

    requests: int = 0
    gets: int = 0
    heads: int = 0
    bytes_sent: int = 0
    faults: int = 0
    not_found: int = 0
    throttled: int = 0
    held: int = 0
    stragglers: int = 0
    abandoned: int = 0
    keys: Mapping[str, KeyStats] = field(default_factory=dict)

    def gets_where(self, predicate: Any) -> int:
        """GETs of the keys for which ``predicate(key)`` is true."""
        return sum(s.gets for k, s in self.keys.items() if predicate(k))

    def bytes_where(self, predicate: Any) -> int:
        """Body bytes sent for the keys for which ``predicate(key)`` is true."""
        return sum(s.bytes_sent for k, s in self.keys.items() if predicate(k))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["keys"] = {k: dataclasses.asdict(v) for k, v in self.keys.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EmulatorStats:
        keys = {k: KeyStats(**v) for k, v in d.get("keys", {}).items()}
        return cls(**{k: v for k, v in d.items() if k != "keys"}, keys=keys)


class Counters:
    """Mutable counters behind a lock; :meth:`snapshot` freezes them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = self.gets = self.heads = self.bytes_sent = self.faults = self.not_found = 0
        self.throttled = self.held = self.stragglers = self.abandoned = 0
        self.keys: dict[str, list[int]] = {}  # key -> [gets, heads, bytes_sent, faults, abandoned]

    def _row(self, key: str) -> list[int]:
        row = self.keys.get(key)
        if row is None:
            row = self.keys[key] = [0, 0, 0, 0, 0]
        return row

    def request(self, key: str, method: str) -> None:
        with self.lock:
            self.requests += 1
            row = self._row(key)
            if method == "GET":
                self.gets += 1
                row[0] += 1
            elif method == "HEAD":
                self.heads += 1
                row[1] += 1

    def sent(self, key: str, nbytes: int) -> None:
        with self.lock:
            self.bytes_sent += nbytes
            self._row(key)[2] += nbytes

    def fault(self, key: str) -> None:
        with self.lock:
            self.faults += 1
            self._row(key)[3] += 1

    def missing(self) -> None:
        with self.lock:
            self.not_found += 1

    def throttle(self, key: str) -> None:
        with self.lock:
            self.throttled += 1
            self.faults += 1
            self._row(key)[3] += 1

    def hold(self, key: str) -> None:
        with self.lock:
            self.held += 1

    def straggle(self, key: str) -> None:
        with self.lock:
            self.stragglers += 1

    def abandon(self, key: str) -> None:
        with self.lock:
            self.abandoned += 1
            self._row(key)[4] += 1

    def snapshot(self) -> EmulatorStats:
        with self.lock:
            return EmulatorStats(
                requests=self.requests,
                gets=self.gets,
                heads=self.heads,
                bytes_sent=self.bytes_sent,
                faults=self.faults,
                not_found=self.not_found,
                throttled=self.throttled,
                held=self.held,
                stragglers=self.stragglers,
                abandoned=self.abandoned,
                keys={k: KeyStats(*row) for k, row in self.keys.items()},
            )
