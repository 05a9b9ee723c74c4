"""The disk cache's parts built by hand, as ``DiskCache`` builds them, for the tests of one part at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from insitubatch.cache import CacheOptions
from insitubatch.cache.claims import Claims
from insitubatch.cache.files import new_writer_token
from insitubatch.cache.held import HeldChunks
from insitubatch.cache.index import CacheIndex
from insitubatch.cache.lock import release_fds
from insitubatch.cache.reading import CacheReader
from insitubatch.cache.space import DiskSpace
from insitubatch.cache.writing import CacheWriter


@dataclass
class Parts:
    """One cache's collaborating parts; ``writer`` is ``None`` for a readonly reader, which needs none."""

    index: CacheIndex
    held: HeldChunks
    claims: Claims
    space: DiskSpace
    reader: CacheReader
    writer: CacheWriter | None
    fds: list[int]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.abort_all()
        self.claims.release_all()
        self.held.close()
        self.index.close()
        release_fds(self.fds)


@pytest.fixture
def cache_parts() -> Iterator[Callable[..., Parts]]:
    """``cache_parts(options, fingerprints)``: the parts over ``options.cache_dir``, admitted; closed at teardown."""
    made: list[Parts] = []

    def build(options: CacheOptions, fingerprints: dict[str, str]) -> Parts:
        assert options.cache_dir is not None
        fds: list[int] = []
        lock = threading.RLock()
        space = DiskSpace(options.cache_dir, persist=options.persist, writes=not options.readonly)
        index = CacheIndex(options, fingerprints, space=space, fds=fds)
        held = HeldChunks(options.cache_dir)
        claims = Claims(index.shared_dir, fds)
        reader = CacheReader(options, index=index, held=held, claims=claims, space=space, lock=lock)
        writer = None
        if options.readonly:
            index.open_as_reader()
        else:
            token = new_writer_token()
            writer = CacheWriter(
                options, token=token, index=index, held=held, claims=claims, space=space, reader=reader, lock=lock
            )
            options.cache_dir.mkdir(parents=True, exist_ok=True)
            index.open_as_writer(token)
        parts = Parts(index, held, claims, space, reader, writer, fds)
        made.append(parts)
        return parts

    yield build
    for parts in made:
        parts.close()
