"""The split a measurement reads: its store, geometries and train samples, and the stored chunks (tiles) they touch.

Every loader of a run reads the train split insitubatch iterates (the same
``split_by_chunk`` fractions), so every row is over the same samples; the
tiles those samples touch are the fewest GETs any loader needs
(:func:`min_gets`), and the server's counters are read through
:func:`data_key_predicate` so metadata GETs are counted apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "data_key_predicate",
    "geometries",
    "min_gets",
    "open_location",
    "open_store",
    "sample_nbytes",
    "tile_keys",
    "train_indices",
]

# Metadata keys that are not chunk data (zarr v2 and v3).
_METADATA_NAMES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")
# The S3 view of the emulator answers any region; obstore wants one named.
EMULATOR_REGION = "us-east-1"


def data_key_predicate(dataset: str, variables: Sequence[str]) -> Callable[[str], bool]:
    """``key -> bool``: is ``key`` (a server path) a chunk of one of ``variables`` of ``dataset``?"""
    prefixes = tuple(f"{dataset.strip('/')}/{v}/" for v in variables)

    def is_data(key: str) -> bool:
        return key.startswith(prefixes) and not key.endswith(_METADATA_NAMES)

    return is_data


def open_store(url: str) -> Any:
    """A read-only obstore-backed zarr store at ``url`` (a local path or an emulator URL)."""
    from insitubatch.stores.obstore_stores import obstore_store

    return obstore_store(url, read_only=True)


def open_location(location: dict[str, Any]) -> Any:
    """Our read-only store for a measurement's location: local files, the emulator over HTTP, or its S3 view.

    ``location`` is ``{"kind": "file" | "http" | "s3", "path": <the local copy>, ...}`` with ``url`` for
    ``http``, ``bucket`` and ``endpoint`` for ``s3``; ``path`` is what the decode ceiling reads from disk.
    """
    from insitubatch.stores.obstore_stores import obstore_store

    kind = location["kind"]
    if kind == "file":
        return obstore_store(location["path"], read_only=True)
    if kind == "http":
        return obstore_store(location["url"], read_only=True)
    if kind == "s3":
        return obstore_store(
            f"s3://{location['bucket']}",
            read_only=True,
            endpoint=location["endpoint"],
            anonymous=True,
            region=EMULATOR_REGION,
        )
    raise ValueError(f"location kind={kind!r} must be 'file', 'http' or 's3'")


def geometries(store: Any, variables: Sequence[str]) -> dict[str, Any]:
    """``{variable: ArrayGeometry}`` of ``variables`` in the group at ``store``."""
    from insitubatch.io.group import open_geometries

    return open_geometries(store, variables=list(variables))


def train_indices(geoms: dict[str, Any], fractions: Sequence[float]) -> np.ndarray:
    """The train split's sample indices — the same split insitubatch iterates."""
    from insitubatch.plan.splits import split_by_chunk

    manifest = split_by_chunk(next(iter(geoms.values())), fractions=tuple(fractions))
    return manifest.sample_indices("train")


def min_gets(indices: np.ndarray, geoms: dict[str, Any]) -> int:
    """Distinct stored chunks (tiles) the samples ``indices`` touch: the fewest GETs that read them."""
    total = 0
    for g in geoms.values():
        total += len(np.unique(indices // g.sample_chunk_size)) * g.tiles_per_chunk
    return int(total)


def sample_nbytes(geoms: dict[str, Any]) -> int:
    """Decoded bytes of one sample of every variable."""
    return int(sum(g.sample_nbytes for g in geoms.values()))


def tile_keys(geoms: dict[str, Any], indices: np.ndarray) -> list[tuple[Any, tuple[int, ...], str]]:
    """``(geometry, coord, key)`` of every stored chunk the samples ``indices`` touch, in chunk order."""
    out = []
    for g in geoms.values():
        for c in np.unique(indices // g.sample_chunk_size).tolist():
            for t in range(g.tiles_per_chunk):
                coord = g.physical_chunk_coord(int(c), t)
                out.append((g, coord, g.chunk_key(coord)))
    return out
