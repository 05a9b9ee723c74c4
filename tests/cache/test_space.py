"""DiskSpace: a full disk stops a cache writing for good, with one WARNING; every refusal is counted by reason."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from insitubatch.cache.space import DiskSpace


@pytest.mark.parametrize("persist, stops", [(True, "no longer persisted"), (False, "no longer spilled to disk")])
def test_a_full_disk_stops_writing_with_one_warning(tmp_path: Path, caplog, persist: bool, stops: str) -> None:
    space = DiskSpace(tmp_path, persist=persist, writes=True)
    assert space.persisting and space.refused == {}
    with caplog.at_level(logging.WARNING, logger="insitubatch"):
        space.stop(OSError(errno.EDQUOT, "quota"), 4096)
        space.stop(OSError(errno.ENOSPC, "full"), 10)
    warned = [r.getMessage() for r in caplog.records if r.name == "insitubatch"]
    assert len(warned) == 1 and not space.persisting and space.refused == {"full": 2}
    assert f"cache_dir {str(tmp_path)!r} is full ({os.strerror(errno.EDQUOT)})" in warned[0]
    assert "writing 4096 bytes" in warned[0] and stops in warned[0]


def test_refusals_are_counted_by_reason_and_the_budget_is_remembered(tmp_path: Path) -> None:
    space = DiskSpace(tmp_path, persist=True, writes=True)
    space.refuse("busy")
    assert not space.over_budget
    space.refuse("budget")
    space.refuse("budget")
    assert space.over_budget and space.persisting and space.refused == {"busy": 1, "budget": 2}
    assert not DiskSpace(tmp_path, persist=True, writes=False).persisting  # a readonly reader never writes
