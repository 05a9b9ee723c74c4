"""Tile file names, the shared directory's names, and the small records ``DiskCache`` keeps per chunk.

Names are deterministic so a later run (or another writer) finds a persisted
chunk by name, and the ``OWNED_*`` patterns let housekeeping delete only
files this package wrote.

Files in ``cache_dir``
----------------------
``insitu_cache.lock``
    The ``flock`` gate (``lock``): held exclusively while a writer is being
    admitted (or compacts), shared by readonly readers for their lifetime.
``insitu_cache.jsonl``
    The compacted base log (``persist`` only; format in ``log``). Rewritten
    only by a writer that found itself alone.
``insitu_cache.d/<writer>.jsonl``
    One append-only log segment per writer (``ledger``); its owner holds an
    exclusive ``flock`` on it while it lives, which is how other processes
    tell a live writer from a dead one.
``insitu_cache.d/<tile file stem>.claim``
    A write claim (``claims``): the chunk is being made by the writer that
    holds its ``flock``.
``cache-<hash>-<fingerprint>-<chunk>-<slug>.npy``
    A persisted chunk. The fingerprint of its array's chunk transforms is in
    the name, so writers running different transforms never share a file.
``spill-<writer>-<hash>-<chunk>-<slug>.npy``
    An ephemeral (spill) chunk, private to its writer.
``.<name>.<writer>-<n>.tmp``
    A file being written; renamed into place when complete.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field

from .log import LOG_NAME, Key
from .tilefile import TileFile

__all__ = [
    "CLAIM_FILE",
    "DROP_STALE",
    "DROP_SUPERSEDED",
    "DROP_TORN",
    "OWNED_TEMP",
    "OWNED_TILE_FILE",
    "REJECT_CHECKSUM",
    "REJECT_DTYPE",
    "REJECT_FILE",
    "REJECT_MISSING",
    "REJECT_SHAPE",
    "SEGMENT_FILE",
    "SEGMENT_TEMP",
    "SHARED_DIR",
    "WriteHandle",
    "claim_name",
    "new_writer_token",
    "persisted_basename",
    "spill_basename",
]

_PERSIST_PREFIX, _SPILL_PREFIX = "cache", "spill"
SHARED_DIR = "insitu_cache.d"
SEGMENT_SUFFIX, CLAIM_SUFFIX = ".jsonl", ".claim"
# Bytes of the array path's hash in a tile file name (8 hex digits; the slug keeps names readable).
_NAME_HASH_BYTES = 4
# A writer's identity: 8 random bytes, 16 hex digits, in its segment's name and its files' names.
_TOKEN_BYTES = 8
# Longest array-path slug in a tile file name, well inside NAME_MAX (255).
_SLUG_MAX = 64
_HEX8, _HEX16 = "[0-9a-f]{8}", "[0-9a-f]{16}"
_SLUG = r"[A-Za-z0-9_.-]+"
# a persisted file (format 1 had no fingerprint in the name) or a spill file (format 1 had no writer)
OWNED_TILE_FILE = re.compile(
    rf"^(?:{_PERSIST_PREFIX}-{_HEX8}(?:-{_HEX16})?|{_SPILL_PREFIX}-(?:(?P<spiller>{_HEX16})-)?{_HEX8})-\d+-{_SLUG}\.npy$"
)
# a file being written next to its final name: ".<name>.<writer>-<n>.tmp" (or "<pid>-<hex>" outside a cache)
OWNED_TEMP = re.compile(
    rf"^\.(?:(?:{_PERSIST_PREFIX}|{_SPILL_PREFIX})-.*\.npy|{re.escape(LOG_NAME)})\.(?P<tag>[0-9a-f]+)-[0-9a-f]+\.tmp$"
)
SEGMENT_FILE = re.compile(rf"^(?P<token>{_HEX16}){re.escape(SEGMENT_SUFFIX)}$")
SEGMENT_TEMP = re.compile(rf"^\.(?P<token>{_HEX16}){re.escape(SEGMENT_SUFFIX)}\.tmp$")
CLAIM_FILE = re.compile(rf"^(?:{_PERSIST_PREFIX})-.*{re.escape(CLAIM_SUFFIX)}$")
# Reasons ``lookup`` turns a logged entry away (``rejected``) and a load drops one (``dropped``).
REJECT_SHAPE, REJECT_DTYPE, REJECT_MISSING, REJECT_FILE, REJECT_CHECKSUM = (
    "shape",
    "dtype",
    "missing",
    "file",
    "checksum",
)
DROP_STALE, DROP_SUPERSEDED, DROP_TORN = "stale", "superseded", "torn"


def new_writer_token() -> str:
    """A fresh writer identity (16 hex digits)."""
    return secrets.token_hex(_TOKEN_BYTES)


def _path_parts(path: str) -> tuple[str, str]:
    """The array path's hash (keeps two paths with one slug apart) and its readable slug."""
    digest = hashlib.blake2b(path.encode(), digest_size=_NAME_HASH_BYTES).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", path).strip("._")[:_SLUG_MAX] or "array"
    return digest, slug


def persisted_basename(path: str, chunk_index: int, fingerprint: str) -> str:
    """The persisted tile file of ``(path, chunk_index)`` made by the pipeline ``fingerprint``: a bare basename.

    ``path`` is an opaque name (an array path, or a path with a selection
    suffix); only its hash and a slug of it appear.
    """
    digest, slug = _path_parts(path)
    return f"{_PERSIST_PREFIX}-{digest}-{fingerprint}-{int(chunk_index)}-{slug}.npy"


def spill_basename(path: str, chunk_index: int, writer: str) -> str:
    """The ephemeral tile file of ``(path, chunk_index)`` private to ``writer``: a bare basename."""
    digest, slug = _path_parts(path)
    return f"{_SPILL_PREFIX}-{writer}-{digest}-{int(chunk_index)}-{slug}.npy"


def claim_name(tile_file: str) -> str:
    """The claim file (in ``SHARED_DIR``) of a persisted tile file."""
    return tile_file.removesuffix(".npy") + CLAIM_SUFFIX


@dataclass(eq=False)
class WriteHandle:
    """A chunk being written by ``DiskCache.begin``: its tile file under a temporary name."""

    key: Key
    tile_file: TileFile
    nbytes: int
    written: set[int] = field(default_factory=set)
    done: bool = False
