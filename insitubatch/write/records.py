"""Small JSON records beside a zarr group, created atomically: the claim and coverage store.

Parallel writers coordinate through records kept under ``<group>/.insitubatch/``.
Each record is itself an empty zarr v3 group whose attributes hold the payload
(``<group>/.insitubatch/claims/<start>-<stop>/zarr.json``), so the output
group stays a valid zarr hierarchy: listing its members, ``tree()`` or
``open_geometries`` never meet a key zarr does not recognise.

Correctness rests on one primitive, *create if absent*, which must be atomic
across processes and machines:

- ``zarr.storage.LocalStore``: the payload is written to a private temporary
  file, then hard-linked to its final name (``os.link`` fails if the name
  exists), so a reader never sees a half-written record.
- ``zarr.storage.ObjectStore``: obstore's ``put(..., mode="create")``
  (S3 ``If-None-Match: *``, GCS/Azure preconditions, local files), which
  the store layer's ``ObjectRecords`` sends.
- ``zarr.storage.MemoryStore``: a lock-protected check-and-set (one process).
- an icechunk session's store: a lock-protected check-and-set too, since a
  session is private to its process until it is merged (``icechunk_records``).

Any other store is refused with :class:`~insitubatch.errors.WriteClaimError`.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore, ObjectStore

from .._zarr_compat import memory_store_dict, unwrap_store
from ..errors import WriteClaimError
from ..stores.icechunk_stores import icechunk_session
from ..stores.object_records import ObjectRecords
from .icechunk_records import IcechunkRecords

__all__ = ["RecordStore"]

# The zarr v3 metadata document every record lives in.
NODE_DOCUMENT = "zarr.json"
# Attribute under which insitubatch keeps a record's payload.
PAYLOAD_ATTRIBUTE = "insitubatch"
# Directory (zarr group) beside the indexed arrays that holds every record.
RECORDS_DIR = ".insitubatch"

# A record's version: an opaque token a compare-and-swap checks against.
Version = object
# Tries at making a record's directory that a concurrent delete keeps removing.
_MKDIR_ATTEMPTS = 3


def _group_document(payload: Mapping[str, Any] | None) -> bytes:
    attributes = {} if payload is None else {PAYLOAD_ATTRIBUTE: dict(payload)}
    doc = {"zarr_format": 3, "node_type": "group", "attributes": attributes}
    return json.dumps(doc, sort_keys=True).encode()


def _payload_of(raw: bytes, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
        payload = doc["attributes"][PAYLOAD_ATTRIBUTE]
    except (ValueError, KeyError, TypeError) as exc:
        raise WriteClaimError(f"record {key!r} is not an insitubatch write record: {exc}") from exc
    if not isinstance(payload, dict):
        raise WriteClaimError(f"record {key!r} holds {type(payload).__name__}, expected a JSON object")
    return payload


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


class _Backend(ABC):
    """Byte-level record operations on one kind of store. Keys are zarr keys."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> Version | None:
        """Write ``data`` at ``key`` unless something is there; ``None`` if it was."""

    @abstractmethod
    def read(self, key: str) -> tuple[bytes, Version] | None:
        """The bytes at ``key`` and their version, or ``None`` when absent."""

    @abstractmethod
    def replace(self, key: str, data: bytes, expected: Version) -> Version | None:
        """Overwrite ``key`` only if it is still at version ``expected``; ``None`` if not."""

    @abstractmethod
    def overwrite(self, key: str, data: bytes) -> Version:
        """Write ``data`` at ``key`` whatever is there."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (and the record's now-empty directory); absent is fine."""

    @abstractmethod
    def keys_under(self, prefix: str) -> list[str]:
        """Every key below ``prefix`` (recursive)."""


class _LocalBackend(_Backend):
    """Records as files under a ``LocalStore``'s root; create is temp file + ``os.link``."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, key: str) -> Path:
        return self._root / key

    def _write_temp(self, path: Path, data: bytes) -> Path:
        temp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        for attempt in itertools.count(1):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(temp, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                return temp
            except FileNotFoundError:
                # a concurrent delete removed the record's directory right after we made it
                if attempt == _MKDIR_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")  # itertools.count never ends

    def create(self, key: str, data: bytes) -> Version | None:
        path = self._path(key)
        temp = self._write_temp(path, data)
        try:
            os.link(temp, path)
        except FileExistsError:
            return None
        except OSError as exc:
            raise WriteClaimError(
                f"cannot hard-link {temp} to {path} ({exc}); slot claims on a local directory need a "
                "filesystem with hard links (exclusive, atomic create)"
            ) from exc
        finally:
            temp.unlink(missing_ok=True)
        return data

    def read(self, key: str) -> tuple[bytes, Version] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, data

    def replace(self, key: str, data: bytes, expected: Version) -> Version | None:
        # Compare then rename: not atomic against a concurrent writer of the same
        # record, but only the claim's owner rewrites it (heartbeats), and an
        # intruder is caught by the next comparison.
        current = self.read(key)
        if current is None or current[1] != expected:
            return None
        return self.overwrite(key, data)

    def overwrite(self, key: str, data: bytes) -> Version:
        path = self._path(key)
        temp = self._write_temp(path, data)
        os.replace(temp, path)
        return data

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # a record's directory holds only its document
        except OSError:
            pass

    def keys_under(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if not name.startswith("."):  # in-flight temporary files
                    keys.append(Path(dirpath, name).relative_to(self._root).as_posix())
        return keys


# One lock for every MemoryStore: their dicts live in this process only.
_MEMORY_LOCK = threading.Lock()


class _MemoryBackend(_Backend):
    """Records in a ``MemoryStore``'s dict; create is a check-and-set under a lock."""

    def __init__(self, store: MemoryStore) -> None:
        # zarr keeps a MemoryStore's contents in a private dict; there is no
        # public synchronous create-if-absent that reports whether it created.
        self._dict = memory_store_dict(store)
        self._buffer = default_buffer_prototype().buffer

    def create(self, key: str, data: bytes) -> Version | None:
        with _MEMORY_LOCK:
            if key in self._dict:
                return None
            self._dict[key] = self._buffer.from_bytes(data)
        return data

    def read(self, key: str) -> tuple[bytes, Version] | None:
        with _MEMORY_LOCK:
            buf = self._dict.get(key)
        if buf is None:
            return None
        data = buf.to_bytes()
        return data, data

    def replace(self, key: str, data: bytes, expected: Version) -> Version | None:
        with _MEMORY_LOCK:
            buf = self._dict.get(key)
            if buf is None or buf.to_bytes() != expected:
                return None
            self._dict[key] = self._buffer.from_bytes(data)
        return data

    def overwrite(self, key: str, data: bytes) -> Version:
        with _MEMORY_LOCK:
            self._dict[key] = self._buffer.from_bytes(data)
        return data

    def delete(self, key: str) -> None:
        with _MEMORY_LOCK:
            self._dict.pop(key, None)

    def keys_under(self, prefix: str) -> list[str]:
        start = prefix.rstrip("/") + "/"
        with _MEMORY_LOCK:
            return [k for k in self._dict if k.startswith(start)]


def _unwrap(store: Store) -> Store:
    return unwrap_store(store)


def _backend_for(store: Store) -> _Backend | ObjectRecords | IcechunkRecords:
    inner = _unwrap(store)
    if isinstance(inner, LocalStore):
        return _LocalBackend(Path(inner.root))
    if isinstance(inner, ObjectStore):
        return ObjectRecords(inner.store)
    if isinstance(inner, MemoryStore):
        return _MemoryBackend(inner)
    if icechunk_session(inner) is not None:
        return IcechunkRecords(inner)
    raise WriteClaimError(
        f"a {type(inner).__name__} cannot create a record atomically, so "
        "parallel writers cannot claim slots on it; use zarr.storage.LocalStore, "
        "zarr.storage.ObjectStore (obstore: S3, GCS, Azure, local), MemoryStore, or an icechunk "
        "session (insitubatch.write.IcechunkTransaction)"
    )


class RecordStore:
    """Named JSON records of one kind (``claims``, ``coverage``) beside a zarr group.

    Parameters
    ----------
    store
        The zarr store holding the group.
    group
        Path of the group inside the store (``""`` for the root).
    kind
        Subdirectory of ``.insitubatch`` the records live in.
    """

    def __init__(self, store: Store, group: str, kind: str) -> None:
        self._backend = _backend_for(store)
        self._read_only = bool(getattr(store, "read_only", False))
        self.store = store
        self.group = group.strip("/")
        self.kind = kind
        self._records = _join(self.group, RECORDS_DIR)
        self.prefix = _join(self._records, kind)

    def key(self, name: str) -> str:
        """The store key of record ``name``'s document."""
        return _join(self.prefix, name, NODE_DOCUMENT)

    def _check_writable(self) -> None:
        if self._read_only:
            raise WriteClaimError(f"store={self.store!r} is read-only; parallel writers need a writable store")

    def ensure_containers(self) -> None:
        """Create the ``.insitubatch`` and ``<kind>`` group documents if missing (idempotent)."""
        self._check_writable()
        for prefix in (self._records, self.prefix):
            key = _join(prefix, NODE_DOCUMENT)
            if self._backend.read(key) is None:
                self._backend.create(key, _group_document(None))

    def create(self, name: str, payload: Mapping[str, Any]) -> Version | None:
        """Create record ``name`` atomically; ``None`` when one already exists."""
        self._check_writable()
        return self._backend.create(self.key(name), _group_document(payload))

    def read(self, name: str) -> tuple[dict[str, Any], Version] | None:
        """Record ``name``'s payload and version, or ``None`` when absent."""
        key = self.key(name)
        found = self._backend.read(key)
        if found is None:
            return None
        return _payload_of(found[0], key), found[1]

    def replace(self, name: str, payload: Mapping[str, Any], expected: Version) -> Version | None:
        """Overwrite record ``name`` if still at ``expected``; ``None`` when it changed or vanished."""
        self._check_writable()
        return self._backend.replace(self.key(name), _group_document(payload), expected)

    def overwrite(self, name: str, payload: Mapping[str, Any]) -> Version:
        """Write record ``name`` unconditionally (forced claims and coverage)."""
        self._check_writable()
        return self._backend.overwrite(self.key(name), _group_document(payload))

    def delete(self, name: str) -> None:
        """Remove record ``name``; absent is fine."""
        self._check_writable()
        self._backend.delete(self.key(name))

    def names(self) -> list[str]:
        """Every record's name, sorted."""
        suffix = "/" + NODE_DOCUMENT
        names = set()
        for key in self._backend.keys_under(self.prefix):
            rel = key[len(self.prefix) + 1 :] if key.startswith(self.prefix + "/") else None
            if rel and rel.endswith(suffix) and "/" not in rel[: -len(suffix)]:
                names.add(rel[: -len(suffix)])
        return sorted(names)

    def payloads(self) -> dict[str, dict[str, Any]]:
        """Every record's payload by name (records removed while listing are skipped)."""
        found = {}
        for name in self.names():
            record = self.read(name)
            if record is not None:
                found[name] = record[0]
        return found
