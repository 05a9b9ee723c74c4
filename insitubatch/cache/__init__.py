"""The disk tier of the chunk pool, optionally persisted across runs (see ``disk``)."""

from __future__ import annotations

from .disk import DiskCache, open_dataset_cache
from .files import (
    DROP_STALE,
    DROP_SUPERSEDED,
    DROP_TORN,
    REJECT_CHECKSUM,
    REJECT_DTYPE,
    REJECT_FILE,
    REJECT_MISSING,
    REJECT_SHAPE,
    SHARED_DIR,
    WriteHandle,
    persisted_basename,
    spill_basename,
)
from .fingerprint import (
    FINGERPRINT_FORMAT,
    FINGERPRINT_HEX_LEN,
    array_fingerprints,
    is_fingerprint,
    source_identity,
)
from .lock import LOCK_NAME, network_filesystem
from .log import LOG_FORMAT, LOG_NAME, LOG_VERSION, LogEntry
from .options import CACHE_PARAMETERS, ON_CORRUPT, CacheOptions, OnCorrupt
from .reading import Found

__all__ = [
    "CACHE_PARAMETERS",
    "CacheOptions",
    "DROP_STALE",
    "DROP_SUPERSEDED",
    "DROP_TORN",
    "DiskCache",
    "FINGERPRINT_FORMAT",
    "FINGERPRINT_HEX_LEN",
    "Found",
    "LOCK_NAME",
    "LOG_FORMAT",
    "LOG_NAME",
    "LOG_VERSION",
    "LogEntry",
    "ON_CORRUPT",
    "OnCorrupt",
    "REJECT_CHECKSUM",
    "REJECT_DTYPE",
    "REJECT_FILE",
    "REJECT_MISSING",
    "REJECT_SHAPE",
    "SHARED_DIR",
    "WriteHandle",
    "array_fingerprints",
    "is_fingerprint",
    "network_filesystem",
    "open_dataset_cache",
    "persisted_basename",
    "source_identity",
    "spill_basename",
]
