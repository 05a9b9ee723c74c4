"""Small objects created only if absent, through an obstore store: what parallel writers' records stand on.

``write.records`` keeps its claim and coverage records as objects; on an
object store their atomic *create if absent* is obstore's
``put(..., mode="create")`` (S3 ``If-None-Match: *``, GCS and Azure
preconditions, local files), and a record's version is the object's ETag
(and version, where the store keeps one) that a conditional update checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import obstore
from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

from ..errors import WriteClaimError

if TYPE_CHECKING:
    from obstore import UpdateVersion

__all__ = ["ObjectRecords"]


def object_version(meta: Mapping[str, Any]) -> dict[str, str]:
    """obstore's ``UpdateVersion`` for an object: its ETag and, where the store has one, version."""
    return {k: meta[k] for k in ("e_tag", "version") if meta.get(k) is not None}


class ObjectRecords:
    """Objects of the obstore store ``store`` (the one under a zarr ``ObjectStore``), written with preconditions.

    Keys are the store's keys; a version is the dict :func:`object_version` makes.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def create(self, key: str, data: bytes) -> dict[str, str] | None:
        """Write ``data`` at ``key`` unless something is there; ``None`` if it was.

        Raises
        ------
        WriteClaimError
            The store cannot create an object only if it is absent (an HTTP endpoint, memory).
        """
        try:
            result = obstore.put(self.store, key, data, mode="create")
        except AlreadyExistsError:
            return None
        except (NotSupportedError, NotImplementedError) as exc:
            raise WriteClaimError(
                f"the obstore store {self.store!r} cannot create an object only if it is absent "
                "(mode='create'), so writers cannot claim slots on it atomically; use S3, GCS, "
                "Azure or a local directory"
            ) from exc
        return object_version(result)

    def read(self, key: str) -> tuple[bytes, dict[str, str]] | None:
        """The bytes at ``key`` and their version, or ``None`` when absent."""
        try:
            result = obstore.get(self.store, key)
        except FileNotFoundError:
            return None
        return bytes(result.bytes()), object_version(result.meta)

    def replace(self, key: str, data: bytes, expected: object) -> dict[str, str] | None:
        """Overwrite ``key`` only if it is still at version ``expected``; ``None`` if not."""
        if expected:
            try:
                # this class's versions are the dicts object_version makes
                mode = cast("UpdateVersion", dict(cast(Mapping[str, str], expected)))
                result = obstore.put(self.store, key, data, mode=mode)
            except (PreconditionError, FileNotFoundError):
                return None
            except (NotSupportedError, NotImplementedError):
                pass  # no conditional update here (local files): compare, then overwrite
            else:
                return object_version(result)
        current = self.read(key)
        if current is None or current[1] != expected:
            return None
        return self.overwrite(key, data)

    def overwrite(self, key: str, data: bytes) -> dict[str, str]:
        """Write ``data`` at ``key`` whatever is there."""
        return object_version(obstore.put(self.store, key, data))

    def delete(self, key: str) -> None:
        """Remove ``key``; absent is fine."""
        try:
            obstore.delete(self.store, key)
        except FileNotFoundError:
            pass

    def keys_under(self, prefix: str) -> list[str]:
        """Every key below ``prefix`` (recursive)."""
        keys: list[str] = []
        for batch in obstore.list(self.store, prefix.rstrip("/") + "/"):
            keys.extend(meta["path"] for meta in batch)
        return keys
