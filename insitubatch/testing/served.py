"""A zarr group on disk behind the loopback emulator: its URL, a store over it, the server's counters.

:func:`serve_zarr` starts an emulator over the group's parent directory with
the link settings given (time to first byte, jitter, bandwidth, and any
other setting the emulator takes, passed through by name) and returns a
:class:`ServedZarr`. By default the server runs in a child process
(:class:`~insitubatch.testing.emulator.EmulatorProcess`) so that the
code being measured does not share its interpreter with the server;
``process=False`` runs it in a thread of this process, which also allows
fault injection (``served.server.inject(...)``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .emulator import DEFAULT_JITTER_S, DEFAULT_LATENCY_S, Emulator, EmulatorProcess, EmulatorStats

__all__ = ["ServedZarr", "serve_zarr"]

# Metadata documents of zarr v2 and v3: a GET of one is not a chunk read.
METADATA_NAMES = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


class ServedZarr:
    """One zarr group served over HTTP by an emulator this object owns (``close()`` stops it)."""

    def __init__(self, path: Path, server: Emulator | EmulatorProcess) -> None:
        self.path = path
        self.server = server
        self.url = server.url_for(path.name)
        self._closed = False

    def store(self, **options: Any) -> Any:
        """A read-only zarr store over :attr:`url` (``obstore_store``; ``options`` go to it)."""
        from ..stores.obstore_stores import obstore_store

        return obstore_store(self.url, read_only=True, **options)

    def stats(self) -> EmulatorStats:
        """The server's counters since it started or the last :meth:`reset_stats`."""
        return self.server.stats()

    def reset_stats(self) -> None:
        self.server.reset_stats()

    def configure(self, **settings: Any) -> Any:
        """Change link settings while serving (``latency_s=...``, ...); see the emulator's ``configure``."""
        return self.server.configure(**settings)

    def store_key(self, server_key: str) -> str:
        """A key as the server counted it (``name/array/c/0``) made relative to the group, as a store sees it."""
        prefix = f"{self.path.name}/"
        return server_key[len(prefix) :] if server_key.startswith(prefix) else server_key

    def chunk_gets(self, stats: EmulatorStats | None = None) -> list[str]:
        """Every chunk GET in ``stats`` (default: now), as store keys, repeated as often as it was fetched."""
        stats = self.stats() if stats is None else stats
        keys = []
        for key, counted in sorted(stats.keys.items()):
            if counted.gets and not key.endswith(METADATA_NAMES):
                keys += [self.store_key(key)] * counted.gets
        return keys

    def close(self) -> None:
        """Stop the server. Idempotent."""
        if not self._closed:
            self._closed = True
            self.server.close()

    def __enter__(self) -> ServedZarr:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ServedZarr({str(self.path)!r}, url={self.url!r})"


def serve_zarr(
    path: str | os.PathLike[str],
    *,
    latency_s: float = DEFAULT_LATENCY_S,
    jitter_s: float = DEFAULT_JITTER_S,
    bandwidth_bytes_per_s: float | None = None,
    process: bool = True,
    **link: Any,
) -> ServedZarr:
    """Serve the zarr group at ``path`` over HTTP on 127.0.0.1 with the given link settings.

    Parameters
    ----------
    path
        A zarr group directory. Over HTTP, opening it without naming its
        variables needs consolidated metadata (``zarr.consolidate_metadata``).
    latency_s, jitter_s, bandwidth_bytes_per_s
        Time to first byte (a floor, plus a uniform draw up to ``jitter_s``)
        and the per-connection body rate (``None``: unpaced).
    process
        Serve from a child process (default), or from a thread here.
    **link
        Any further link setting the emulator takes, by its name.

    Raises
    ------
    NotADirectoryError
        ``path`` is not a directory.
    TypeError, ValueError
        A setting the emulator does not know, or a value it refuses.
    """
    path = Path(path).resolve()
    if not path.is_dir():
        raise NotADirectoryError(f"path={str(path)!r} is not a zarr group directory")
    settings: dict[str, Any] = {"latency_s": latency_s, "jitter_s": jitter_s}
    settings["bandwidth_bytes_per_s"] = bandwidth_bytes_per_s
    server: Emulator | EmulatorProcess
    if process:
        server = EmulatorProcess(path.parent, **settings)
        try:
            if link:  # settings beyond the three the child takes on its command line
                server.configure(**link)
        except BaseException:
            server.close()
            raise
    else:
        server = Emulator(path.parent, **settings, **link)
    return ServedZarr(path, server)
