"""How the emulated link answers a request: when its first byte leaves, whether it is throttled or never answered.

:class:`LinkModel` holds the emulator's link settings (every keyword of
``Emulator.configure`` and every key of ``POST /_emulator/config``) and
draws, per request, what the server does before the response starts:

* **time to first byte** — ``latency_s`` plus a uniform draw in
  ``[0, jitter_s]``, plus an exponential draw of mean ``tail_s`` (the heavy
  tail of a real bucket: most requests near the floor, a few far above it),
  plus ``straggler_s`` for a ``straggler_share`` of requests (a response that
  arrives seconds late);
* **throttling** — a ``throttle_share`` of GETs is answered 503 with an S3
  ``SlowDown`` error body. With ``throttle_period_s`` set, only during the
  first ``throttle_burst_s`` of every period (bursts, as a bucket prefix
  that is hit too hard answers);
* **silence** — a ``hold_share`` of GETs, and every GET of a key matching
  the glob ``hold_key`` (a dead object; with ``hold_times``, only that many
  of them, then it answers), gets no byte at all: the request is held open
  until the client gives up or the emulator closes.

The server waits out the delay watching its socket, so a client that
abandons the request (a cancelled duplicate, a retried stall) ends the wait
at once and is counted as ``abandoned``.
"""

from __future__ import annotations

import fnmatch
import math
import random
import select
import socket
import ssl
import threading
import time
from typing import Any

__all__ = ["SLOWDOWN_BODY", "LinkModel", "wait_or_gone"]

# What S3 sends with a 503 when a prefix is read too fast (the code clients key on).
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>\n"
)
# The longest single wait on a socket: a hold re-checks the emulator's shutdown this often.
HOLD_POLL_S = 0.25
_SHARES = ("straggler_share", "throttle_share", "hold_share")
_DURATIONS = ("latency_s", "jitter_s", "tail_s", "straggler_s", "throttle_period_s", "throttle_burst_s")


class LinkModel:
    """The link settings of one emulator; each request reads them when it arrives."""

    def __init__(self, seed: int = 0) -> None:
        self.latency_s = 0.0
        self.jitter_s = 0.0
        self.tail_s = 0.0
        self.straggler_share = 0.0
        self.straggler_s = 0.0
        self.throttle_share = 0.0
        self.throttle_period_s = 0.0
        self.throttle_burst_s = 0.0
        self.hold_share = 0.0
        self.hold_key: str | None = None
        self.hold_times: int | None = None
        self._held = 0  # GETs held for hold_key since it was set
        self.bandwidth_bytes_per_s: float | None = None
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def configure(self, **settings: Any) -> None:
        """Change any of the settings named in the module docstring; others keep their value.

        Raises ``TypeError`` for an unknown name and ``ValueError`` for a
        negative duration, a share outside ``[0, 1]`` or a non-positive bandwidth.
        """
        unknown = sorted(set(settings) - set(self.settings()))
        if unknown:
            raise TypeError(f"unknown link settings {unknown}; valid are {sorted(self.settings())}")
        for name in _DURATIONS:
            if name in settings:
                value = float(settings[name])
                if not value >= 0:
                    raise ValueError(f"{name}={settings[name]!r} must be >= 0")
                setattr(self, name, value)
        for name in _SHARES:
            if name in settings:
                value = float(settings[name])
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"{name}={settings[name]!r} must be in [0, 1]")
                setattr(self, name, value)
        if "hold_key" in settings:
            key = settings["hold_key"]
            if key is not None and not isinstance(key, str):
                raise ValueError(f"hold_key={key!r} must be a key glob or None")
            self.hold_key = key
            self._held = 0
        if "hold_times" in settings:
            times = settings["hold_times"]
            if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
                raise ValueError(f"hold_times={times!r} must be an int >= 1, or None for every GET")
            self.hold_times = times
            self._held = 0
        if "bandwidth_bytes_per_s" in settings:
            rate = settings["bandwidth_bytes_per_s"]
            if rate is not None and not float(rate) > 0:
                raise ValueError(f"bandwidth_bytes_per_s={rate!r} must be > 0, or None for unpaced")
            self.bandwidth_bytes_per_s = None if rate is None else float(rate)
        if "throttle_period_s" in settings or "throttle_burst_s" in settings:
            self._t0 = time.monotonic()  # a new burst pattern starts with a burst

    def settings(self) -> dict[str, Any]:
        """Every setting and its value (what ``/_emulator/config`` answers)."""
        return {
            "latency_s": self.latency_s,
            "jitter_s": self.jitter_s,
            "tail_s": self.tail_s,
            "straggler_share": self.straggler_share,
            "straggler_s": self.straggler_s,
            "throttle_share": self.throttle_share,
            "throttle_period_s": self.throttle_period_s,
            "throttle_burst_s": self.throttle_burst_s,
            "hold_share": self.hold_share,
            "hold_key": self.hold_key,
            "hold_times": self.hold_times,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
        }

    # -- per-request draws (connection threads) -----------------------------------------
    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    def first_byte_delay(self) -> tuple[float, bool]:
        """Seconds before a response's first byte, and whether the request drew a straggler's delay."""
        delay = self.latency_s
        if self.jitter_s > 0:
            delay += self.jitter_s * self._draw()
        if self.tail_s > 0:
            delay += -self.tail_s * math.log(1.0 - self._draw())
        straggler = self.straggler_share > 0 and self._draw() < self.straggler_share
        if straggler:
            delay += self.straggler_s
        return delay, straggler

    def throttled(self) -> bool:
        """Whether this GET is answered 503 SlowDown."""
        if self.throttle_share <= 0:
            return False
        if (
            self.throttle_period_s > 0
            and (time.monotonic() - self._t0) % self.throttle_period_s >= self.throttle_burst_s
        ):
            return False
        return self._draw() < self.throttle_share

    def held(self, key: str) -> bool:
        """Whether this GET of ``key`` gets no byte at all."""
        if self.hold_key is not None and fnmatch.fnmatchcase(key, self.hold_key):
            with self._lock:
                if self.hold_times is None or self._held < self.hold_times:
                    self._held += 1
                    return True
        return self.hold_share > 0 and self._draw() < self.hold_share


def wait_or_gone(sock: socket.socket, seconds: float, closing: threading.Event) -> bool:
    """Wait ``seconds`` (``inf``: until the client or the emulator goes); False if either went first.

    A keep-alive client sends nothing while it awaits an answer, so a
    readable socket here means it closed (or reset) the connection.
    """
    deadline = time.monotonic() + seconds
    watch = not isinstance(sock, ssl.SSLSocket)  # (a TLS socket cannot peek: over HTTPS, wait on the clock)
    while (left := deadline - time.monotonic()) > 0:
        if closing.is_set():
            return False
        step = min(left, HOLD_POLL_S)
        if not watch:
            closing.wait(step)
            continue
        try:
            readable = select.select([sock], [], [], step)[0]
            if readable and not sock.recv(1, socket.MSG_PEEK):
                return False
        except (OSError, ValueError):  # reset by the peer, or shut by close_connections
            return False
        if readable:  # a pipelined request's bytes: the socket says nothing more, wait on the clock
            watch = False
    return True
