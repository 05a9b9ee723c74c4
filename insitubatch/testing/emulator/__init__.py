"""A loopback object store on 127.0.0.1 with a real bucket's latency, bandwidth, throttling and faults.

In-process it also runs a test's script (:mod:`.script`): any answer, byte for byte, request by request.
"""

from .handler import DEFAULT_JITTER_S, DEFAULT_LATENCY_S
from .process import EmulatorProcess
from .script import CLOSE, ConnectionRecord, Reply, Request, answer, ranged
from .server import FAULT_KINDS, Emulator
from .stats import EmulatorStats, Fault, KeyStats

__all__ = [
    "CLOSE",
    "DEFAULT_JITTER_S",
    "DEFAULT_LATENCY_S",
    "FAULT_KINDS",
    "ConnectionRecord",
    "Emulator",
    "EmulatorProcess",
    "EmulatorStats",
    "Fault",
    "KeyStats",
    "Reply",
    "Request",
    "answer",
    "ranged",
]
