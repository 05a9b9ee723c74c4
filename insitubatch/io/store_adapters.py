"""Store factories for the optional extras: fsspec (any fsspec protocol) and icechunk repositories.

Split from ``insitubatch.io.stores``, which holds the obstore hot path; both
remember what they build, so :func:`close_store` closes it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .owned import _remember
from .stores import _local_dir, _split_scheme

if TYPE_CHECKING:
    from icechunk import IcechunkStore, Storage
    from zarr.storage import FsspecStore

__all__ = ["fsspec_store", "icechunk_store"]


def fsspec_store(url: str | os.PathLike[str], *, read_only: bool = False, **storage_options: Any) -> FsspecStore:
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
        Passed to the fsspec filesystem.

    Returns
    -------
    zarr.storage.FsspecStore
        Remembered as opened by insitubatch, so :func:`close_store` closes it.

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
    from zarr.storage import FsspecStore

    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or os.PathLike, got {type(url).__name__}")
    protocol, _ = fsspec.core.split_protocol(url)
    if not read_only and protocol in (None, "file", "local"):
        storage_options.setdefault("auto_mkdir", True)
    store = FsspecStore.from_url(url, storage_options=storage_options, read_only=read_only)
    _remember(store)
    return store


def icechunk_store(
    path_or_storage: str | os.PathLike[str] | Storage,
    *,
    branch: str = "main",
    read_only: bool = True,
) -> IcechunkStore:
    """Open a session on an icechunk repository and return its zarr store (the ``icechunk`` extra).

    Parameters
    ----------
    path_or_storage
        A local directory (path or ``file://`` URL) holding the repository, or
        any ``icechunk.Storage`` (e.g. from ``icechunk.s3_storage(...)``).
    branch
        The branch the session reads (or writes to).
    read_only
        ``True``: a read-only session at the tip of ``branch``; the repository
        must exist. ``False``: a writable session, creating the repository if
        there is none. Changes made through a writable store become visible
        after ``store.session.commit(message)``.

    Returns
    -------
    icechunk.IcechunkStore
        Remembered as opened by insitubatch, so :func:`close_store` closes it.

    Raises
    ------
    ImportError
        icechunk is not installed.
    FileNotFoundError
        ``read_only=True`` and no repository exists there.
    ValueError
        A URL other than ``file://``, or an empty ``branch``.
    TypeError
        ``path_or_storage`` is none of the accepted types.
    """
    try:
        import icechunk
    except ImportError as exc:
        raise ImportError(
            "icechunk_store needs icechunk, an optional dependency: pip install 'insitubatch[icechunk]'"
        ) from exc

    if not isinstance(branch, str) or not branch:
        raise ValueError(f"branch={branch!r} must be a non-empty string")
    if isinstance(path_or_storage, icechunk.Storage):
        storage = path_or_storage
        where = repr(storage)
    elif isinstance(path_or_storage, (str, os.PathLike)):
        text = os.fspath(path_or_storage)
        scheme, _ = _split_scheme(text)
        if scheme not in (None, "file"):
            raise ValueError(
                f"path_or_storage={text!r}: icechunk_store takes a local path or file:// URL; for "
                "object storage build an icechunk.Storage (e.g. icechunk.s3_storage(...)) and pass it"
            )
        directory = _local_dir(text, scheme)
        if read_only and not directory.is_dir():
            # checked before icechunk sees the path: its local storage creates the directory
            raise FileNotFoundError(f"no icechunk repository at {directory} (read_only=True creates nothing)")
        storage = icechunk.local_filesystem_storage(str(directory))
        where = str(directory)
    else:
        raise TypeError(
            f"path_or_storage must be a path, a file:// URL or an icechunk.Storage, "
            f"got {type(path_or_storage).__name__}"
        )

    if read_only:
        if not icechunk.Repository.exists(storage):
            raise FileNotFoundError(f"no icechunk repository at {where} (read_only=True creates nothing)")
        session = icechunk.Repository.open(storage).readonly_session(branch=branch)
    else:
        session = icechunk.Repository.open_or_create(storage).writable_session(branch)
    store = session.store
    _remember(store)
    return store
