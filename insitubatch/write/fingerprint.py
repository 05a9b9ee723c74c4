"""``LayoutFingerprint``: the stored facts a slot's alignment rests on, read again before each write.

A slot range is safe only while every indexed array keeps the shape, chunks,
shards, dtype and codecs it had when the range was checked: a writer that
opened before someone re-created an array with other chunks would otherwise
keep writing the old chunk grid into the new array (chunks zarr can no
longer decode, or decodes wrongly), and two writers' ranges may then share a
stored object. The fingerprint is the metadata document (``zarr.json``) of
each indexed array without its attributes, plus the group's layout record.
Checking one array before a write is one small read of the document zarr
itself reads when it opens the array; checking everything (the record and
every array) is ``1 + arrays`` such reads, made when the writer opens and
before it records the slot complete.

What it cannot see: an array re-created with identical metadata (zarr drops
its chunks, the document reads the same).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype

from .._zarr_compat import sync
from ..errors import LayoutChangedError
from .layout import LAYOUT_ATTRIBUTE

__all__ = ["LayoutFingerprint"]

# The zarr v3 metadata document of every node.
_DOCUMENT = "zarr.json"


def _key(*parts: str) -> str:
    return "/".join(p for p in parts if p)


class LayoutFingerprint:
    """The layout facts of one group as a writer found them; :meth:`check` compares the store against them.

    Parameters
    ----------
    store
        The zarr store.
    group
        Path of the output group.
    slot
        The writer's range ``(start, stop)``, named in the errors.
    record
        The group's layout record (``None`` when there is none).
    arrays
        Each indexed array's metadata document without ``attributes``, by name.
    """

    def __init__(
        self, store: Store, group: str, slot: tuple[int, int], record: Any, arrays: Mapping[str, Mapping[str, Any]]
    ) -> None:
        self.store = store
        self.group = group
        self.slot = slot
        self.record = record
        self.arrays = dict(arrays)

    @classmethod
    def read(cls, store: Store, group: str, slot: tuple[int, int]) -> LayoutFingerprint:
        """Read the record and every indexed array's document (``1 + arrays`` small reads)."""
        record = _read_record(store, group)
        indexed = record.get("indexed") if isinstance(record, dict) else None
        names = sorted(indexed) if isinstance(indexed, dict) else []
        return cls(store, group, slot, record, {name: _read_array(store, group, name) for name in names})

    def check(self, array: str, doing: str) -> None:
        """Refuse when ``array``'s stored document no longer matches (one small read).

        Raises
        ------
        LayoutChangedError
            The array was re-created, resized, re-chunked or deleted; names what changed.
        """
        lines = self._array_changes(array)
        if lines:
            raise self._changed(doing, lines)

    def check_all(self, doing: str) -> None:
        """Refuse when the layout record or any indexed array changed (``1 + arrays`` small reads).

        Raises
        ------
        LayoutChangedError
            Names every changed fact.
        """
        lines = []
        record = _read_record(self.store, self.group)
        if record != self.record:
            lines.append(f"layout record ({LAYOUT_ATTRIBUTE}): was {self.record!r}, now {record!r}")
        for name in self.arrays:
            lines.extend(self._array_changes(name))
        if lines:
            raise self._changed(doing, lines)

    def _array_changes(self, name: str) -> list[str]:
        was, now = self.arrays[name], _read_array(self.store, self.group, name)
        if now == was:
            return []
        if not now:
            return [f"{name}: deleted (its metadata document {_key(self.group, name, _DOCUMENT)!r} is gone)"]
        return [
            f"{name}: {fact} was {was.get(fact)!r}, now {now.get(fact)!r}"
            for fact in dict.fromkeys([*was, *now])
            if was.get(fact) != now.get(fact)
        ]

    def _changed(self, doing: str, lines: list[str]) -> LayoutChangedError:
        body = "\n  ".join(lines)
        return LayoutChangedError(
            f"the layout of group={self.group!r} changed under the writer of slot [{self.slot[0]}, "
            f"{self.slot[1]}) (seen {doing}); the slot plan's alignment no longer holds, so nothing more is "
            "written and the slot is not recorded complete. Restore the layout (create_layout with the run's "
            "spec; a re-created array lost its chunks, so clear the coverage of ranges already complete), then "
            f"plan_slots(resume=True) plans the slot again:\n  {body}",
            tuple(lines),
        )


def _read_document(store: Store, key: str) -> dict[str, Any]:
    """The JSON document at ``key``; empty when absent."""
    buffer = sync(store.get(key, default_buffer_prototype()))
    if buffer is None:
        return {}
    try:
        document = json.loads(buffer.to_bytes())
    except ValueError:
        return {"unreadable": buffer.to_bytes().decode(errors="replace")}
    return document if isinstance(document, dict) else {"unreadable": document}


def _read_record(store: Store, group: str) -> Any:
    """The group's layout record, or ``None``."""
    attributes = _read_document(store, _key(group, _DOCUMENT)).get("attributes")
    return attributes.get(LAYOUT_ATTRIBUTE) if isinstance(attributes, dict) else None


def _read_array(store: Store, group: str, name: str) -> dict[str, Any]:
    """Array ``name``'s metadata document without its attributes; empty when deleted."""
    document = _read_document(store, _key(group, name, _DOCUMENT))
    return {fact: value for fact, value in document.items() if fact != "attributes"}
