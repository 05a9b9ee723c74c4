"""Store factories for the optional extras: fsspec (any fsspec protocol) and icechunk repositories.

Split from ``insitubatch.stores.obstore_stores``, which holds the obstore hot path; both
remember what they build, so :func:`close_store` closes it. Icechunk's lives
in ``stores.icechunk_stores`` and is re-exported here.

A store :func:`fsspec_store` builds owns its filesystem (fsspec's instance
cache is skipped), so :func:`close_store` can close what an asynchronous
filesystem holds open (the aiohttp session of HTTP, GCS and Azure
filesystems, with its connections) without closing another store's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from zarr.storage import FsspecStore

from .._zarr_compat import sync
from ..validation import Flag, Instance, Table, validate_params
from .icechunk_stores import icechunk_store
from .reading import StoreReader, own_get_reader

__all__ = ["InSituFsspecStore", "fsspec_store", "icechunk_store"]


class InSituFsspecStore(FsspecStore):
    """The store ``fsspec_store`` builds: zarr's ``FsspecStore`` that carries its reader and closes its filesystem.

    The engine reads it through its own ``get`` (fsspec retries by its own
    rules); :meth:`close` (or leaving ``with store:``) closes the session its
    filesystem opened and the store.
    """

    def reader(self) -> StoreReader:
        """The engine's reader of this store: its own ``get`` (nothing of the engine's to close)."""
        return own_get_reader(self, "an fsspec store: read through its own get, which retries by fsspec's rules")

    def local_reader(self) -> Callable[..., Any] | None:
        """None: an fsspec store is read on zarr's loop, never on the calling thread."""
        return None

    def close(self) -> None:
        """Close the session this store's filesystem opened, then the store."""
        close_filesystem(self.fs)
        super().close()


# What ``fsspec_store`` accepts (``validation``); ``storage_options`` are fsspec's to check
FSSPEC_PARAMETERS: Table = {"url": [Instance((str, os.PathLike), "a str or os.PathLike")], "read_only": [Flag()]}


@validate_params(FSSPEC_PARAMETERS)
def fsspec_store(url: str | os.PathLike[str], *, read_only: bool = False, **storage_options: Any) -> InSituFsspecStore:
    """Build a zarr ``FsspecStore`` for ``url`` through fsspec (the ``fsspec`` extra).

    For protocols obstore has no backend for; obstore is faster where both work.

    Parameters
    ----------
    url
        Any fsspec URL (``memory://``, ``file://``, ``s3://``...) or a local path.
    read_only
        Refuse writes through the returned store. For a local path that is
        writable, missing parent directories are created on write unless
        ``auto_mkdir`` is given.
    **storage_options
        Passed to the fsspec filesystem. ``skip_instance_cache`` defaults to
        ``True``: the store gets a filesystem of its own, which
        :func:`close_store` closes.

    Returns
    -------
    InSituFsspecStore
        A zarr ``FsspecStore`` whose ``close()`` (and :func:`close_store`)
        also closes its filesystem's session (no socket of it stays open).

    Raises
    ------
    ImportError
        fsspec is not installed.
    TypeError
        ``url`` is neither a string nor a path.
    """
    try:
        import fsspec.core
    except ImportError as exc:
        raise ImportError(
            "fsspec_store needs fsspec, an optional dependency: pip install 'insitubatch[fsspec]'"
        ) from exc
    url = os.fspath(url)
    protocol, _ = fsspec.core.split_protocol(url)
    if not read_only and protocol in (None, "file", "local"):
        storage_options.setdefault("auto_mkdir", True)
    # fsspec hands out one cached filesystem per set of options: closing a shared one would close others' stores
    storage_options.setdefault("skip_instance_cache", True)
    plain = FsspecStore.from_url(url, storage_options=storage_options, read_only=read_only)
    return InSituFsspecStore(
        plain.fs, read_only=read_only, path=plain.path, allowed_exceptions=plain.allowed_exceptions
    )


def close_filesystem(fs: Any) -> None:
    """Close the aiohttp session (or s3fs's aiobotocore client) an asynchronous fsspec filesystem opened.

    zarr makes asynchronous filesystems (``asynchronous=True``), whose
    session is created on zarr's IO loop at the first read and must be
    closed there. A filesystem with no session open (never read, or a
    synchronous one behind zarr's wrapper) has nothing to close.
    """
    client = _s3_client(fs)
    if client is not None and asyncio.iscoroutinefunction(getattr(client, "__aexit__", None)):
        sync(client.__aexit__(None, None, None))  # (a later read finds its session closed and makes a fresh client)
        return
    session = getattr(fs, "_session", None)
    if session is None or getattr(session, "closed", True) or not asyncio.iscoroutinefunction(session.close):
        return
    sync(_close_session(session))


def _s3_client(fs: Any) -> Any:
    """s3fs's aiobotocore client of an asynchronous ``fs``, entered at its first read; None before (or not s3fs)."""
    if not getattr(fs, "asynchronous", False) or not hasattr(type(fs), "s3"):
        return None  # (a synchronous s3fs would connect on being asked for its client)
    try:
        return fs.s3
    except RuntimeError:  # "please await .set_session": no client yet, nothing to close
        return None


async def _close_session(session: Any) -> None:
    await session.close()
    # aiohttp closes a connection's transport on the loop's next turn (its documented graceful-close wait)
    await asyncio.sleep(0)
