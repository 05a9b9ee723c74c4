"""Progress bars for long work a person watches, with ``tqdm`` when it is installed.

``tqdm`` is optional (``pip install 'insitubatch[progress]'``). Without it, or
when the stream is not a terminal (a batch job's log, a pipe, CI), a bar is
silent: the wrapped iterable comes back unchanged and ``update()`` does
nothing, so logs never fill with carriage returns.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, Any

__all__ = ["progress"]


class _Silent:
    """The no-op bar: same calls as a ``tqdm`` bar, no output."""

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    unit: str = "it",
    file: IO[str] | None = None,
) -> Any:
    """A bar over ``iterable`` (or, without one, a bar to ``update()`` by hand) on ``file`` (stderr).

    Returns the ``tqdm`` bar when ``tqdm`` is installed and ``file`` is a
    terminal; otherwise ``iterable`` itself (or a silent bar).
    """
    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    tqdm = _tqdm() if isatty is not None and isatty() else None
    if tqdm is None:
        return iterable if iterable is not None else _Silent()
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, leave=False, dynamic_ncols=True)
