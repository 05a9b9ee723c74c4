"""One arena measurement in a fresh interpreter: ``main`` reads a JSON config, runs its loader, prints one result line.

The parent (:mod:`bench.arena.run`) starts this module's :func:`main` in
our virtual environment for ``ours``, ``tensorstore`` and the two
ceilings, and in the reference's own environment for ``reference``
(``python -I``, with this repository appended to ``sys.path`` so that its
``insitubatch`` comes first and ours is never imported). Each loader's
module is imported only when asked for, so the reference's child loads
nothing of ours.

The result line is ``ARENA-RESULT {json}``: the loader's row plus this
process's peak RSS (``VmHWM``), the Python it ran on, and the load average
when it finished. A loader that raises is a row with ``error``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import traceback
from collections.abc import Callable
from typing import Any

from .harness import MB, loadavg, rss_bytes

__all__ = ["RESULT_PREFIX", "main"]

RESULT_PREFIX = "ARENA-RESULT "


def _runner(loader: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function that measures ``loader``, imported now (and only its own module)."""
    if loader == "ours":
        from .ours import run_ours

        return run_ours
    if loader == "reference":
        from .reference import run_reference

        return run_reference
    if loader == "tensorstore":
        from .tensorstore_loop import run_tensorstore

        return run_tensorstore
    if loader == "get_ceiling":
        from .ceilings import run_get_ceiling

        return run_get_ceiling
    if loader == "decode_ceiling":
        from .ceilings import run_decode_ceiling

        return run_decode_ceiling
    raise ValueError(f"loader={loader!r} is not one of ours, reference, tensorstore, get_ceiling, decode_ceiling")


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run ``cfg``'s loader in this process; its row, never an exception."""
    try:
        row = _runner(cfg["loader"])(cfg)
    except Exception as exc:  # a failed loader is a row of the report, not the end of it
        row = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        traceback.print_exc(file=sys.stderr)
    row.update(
        loader=cfg["loader"],
        scenario=cfg.get("scenario"),
        peak_rss_mb=rss_bytes("VmHWM") / MB,
        python=platform.python_version(),
        loadavg_end=loadavg(),
    )
    return row


def main(argv: list[str] | None = None) -> None:
    """``main(['<json config>'])``: measure, print the result line, and leave at once (no thread may hang us)."""
    argv = sys.argv[1:] if argv is None else argv
    row = measure(json.loads(argv[0]))
    sys.stderr.flush()
    print(RESULT_PREFIX + json.dumps(row), flush=True)
    os._exit(0)
