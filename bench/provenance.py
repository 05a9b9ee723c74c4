"""Where a published number came from: the date it was measured and the commit of the code that measured it.

Every table the bench publishes (``bench.run``'s report, ``bench.engine_probe``'s
table) carries :func:`stamp_line`, ``Measured YYYY-MM-DD at commit abc1234``
(``+ local changes`` when the working tree differed from that commit), and
the docs test checks that the numbers copied into README and ``docs/`` carry
one naming a commit of this repository.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["STAMP", "provenance", "stamp_line"]

ROOT = Path(__file__).resolve().parents[1]
# The line a published table carries; group 1 the date, group 2 the commit.
STAMP = re.compile(r"Measured (\d{4}-\d{2}-\d{2}) at commit ([0-9a-f]{7,40})")
SHORT_SHA = 7


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def provenance() -> dict[str, Any]:
    """``{"date", "commit", "local_changes"}`` of a measurement made now (commit None outside a git checkout)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "commit": commit,
        "local_changes": bool(status) if status is not None else None,
    }


def stamp_line(info: dict[str, Any] | None = None) -> str:
    """``Measured <date> at commit <sha>`` (plus `` + local changes``) for a table's header."""
    info = provenance() if info is None else info
    commit = (info.get("commit") or "unknown")[:SHORT_SHA]
    tail = " + local changes" if info.get("local_changes") else ""
    return f"Measured {info['date']} at commit {commit}{tail}"
