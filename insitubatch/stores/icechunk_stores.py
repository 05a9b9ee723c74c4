"""Icechunk repositories as zarr stores: a session at one branch, tag or snapshot (the ``icechunk`` extra).

:func:`icechunk_store` opens the session and returns it as an
:class:`InSituIcechunkStore`: icechunk's own store, every call delegated to
it, carrying how the engine reads it (through icechunk's own ``get``) and
its ``close()``. :func:`snapshot_of` says which
snapshot a store's bytes are, for the disk cache's identity of a source
(``cache.fingerprint.source_identity``): a session at one snapshot reads the
same bytes for ever, so chunks cached from it may be revived by any later
run on that snapshot and by no other.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zarr.abc.store import Store
from zarr.storage import WrapperStore

from .._zarr_compat import unwrap_store
from ..validation import Anything, Flag, Instance, Table, validate_params
from .obstore_stores import local_dir, split_scheme
from .reading import StoreReader, own_get_reader

if TYPE_CHECKING:
    from icechunk import IcechunkStore, Repository, Storage

__all__ = [
    "InSituIcechunkStore",
    "icechunk_session",
    "icechunk_store",
    "import_icechunk",
    "open_repository",
    "snapshot_of",
]

# Whether _collect_at_exit is registered (once per process).
_exit_hook = False
_exit_hook_lock = threading.Lock()
# icechunk's snapshot ids: 12 random bytes in Crockford base32, 20 characters (icechunk spec, "Snapshot IDs").
SNAPSHOT_ID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{20}$")


def import_icechunk() -> Any:
    """icechunk, with the process set to free its objects before interpreter shutdown (:func:`_collect_at_exit`)."""
    global _exit_hook
    try:
        import icechunk
    except ImportError as exc:
        raise ImportError(
            "icechunk_store needs icechunk, an optional dependency: pip install 'insitubatch[icechunk]'"
        ) from exc
    with _exit_hook_lock:
        if not _exit_hook:
            atexit.register(_collect_at_exit)
            _exit_hook = True
    return icechunk


def _collect_at_exit() -> None:
    """Free unreachable icechunk objects while the interpreter still runs.

    icechunk 1.1 aborts the process (SIGABRT) now and then when a session or
    store caught in a reference cycle is finalized during interpreter shutdown:
    measured here, 2 of 240 exits of processes that read a repository and 2 of
    36 of slot-writing tasks; with this collection first, none of 240 and none
    of 60 (and none of 80 on icechunk 2.3 without it). A scheduler would count
    such a task as failed although its work was saved.
    """
    gc.collect()


def open_repository(icechunk: Any, repo: Any, *, create: bool) -> tuple[Repository, str]:
    """The repository ``repo`` names (and how to name it in messages); created when ``create`` and absent."""
    if isinstance(repo, icechunk.Repository):
        return repo, _one_line(repo.storage)
    if isinstance(repo, icechunk.Storage):
        storage, where = repo, _one_line(repo)
    elif isinstance(repo, (str, os.PathLike)):
        text = os.fspath(repo)
        scheme, _ = split_scheme(text)
        if scheme not in (None, "file"):
            raise ValueError(
                f"repo={text!r}: icechunk_store takes a local path or file:// URL; for object storage build "
                "an icechunk.Storage (e.g. icechunk.s3_storage(...)) or an icechunk.Repository and pass it"
            )
        directory = local_dir(text, scheme)
        if not create and not directory.is_dir():
            # checked before icechunk sees the path: its local storage creates the directory
            raise FileNotFoundError(f"no icechunk repository at {directory} (read_only=True creates nothing)")
        storage, where = icechunk.local_filesystem_storage(str(directory)), str(directory)
    else:
        raise TypeError(
            f"repo must be an icechunk.Repository, an icechunk.Storage, a path or a file:// URL, "
            f"got {type(repo).__name__}"
        )
    if create:
        return icechunk.Repository.open_or_create(storage), where
    if not icechunk.Repository.exists(storage):
        raise FileNotFoundError(f"no icechunk repository at {where} (read_only=True creates nothing)")
    return icechunk.Repository.open(storage), where


def _one_line(storage: Any) -> str:
    """A storage as messages name it: its repr on one line (icechunk 2 spreads it over several)."""
    return " ".join(repr(storage).split())


# How describe() and ``insitubatch inspect`` say an icechunk session is read.
ICECHUNK_READ = "an icechunk session: read through its own get (icechunk's client, retries and caches)"


class InSituIcechunkStore(WrapperStore["IcechunkStore"]):
    """The store :func:`icechunk_store` builds: an icechunk session's store, every call delegated to it.

    zarr opens it as any store; icechunk's own attributes (``session``,
    ``set_virtual_ref`` ...) are the session store's. It carries how the
    engine reads it (:meth:`reader`: through icechunk's own ``get``, which
    keeps icechunk's client, retries and caches) and :meth:`close` (also on
    leaving a ``with`` block), which closes the session's store.

    Parameters
    ----------
    store
        The session's store (``session.store``).
    where
        The repository, as messages name it.
    version
        ``(kind, name)`` of the version the session opened: ``("branch", "main")``, ``("tag", ...)``,
        ``("snapshot", ...)``.
    """

    def __init__(self, store: IcechunkStore, *, where: str = "", version: tuple[str, str] = ("branch", "")) -> None:
        super().__init__(store)
        self.where = where
        self.version = version

    @property
    def session(self) -> Any:
        """The icechunk session this store reads and writes (commit a writable one with ``store.session.commit``)."""
        return self._store.session

    @property
    def supports_consolidated_metadata(self) -> bool:
        return self._store.supports_consolidated_metadata

    async def getsize(self, key: str) -> int:
        return await self._store.getsize(key)

    async def getsize_prefix(self, prefix: str) -> int:
        return await self._store.getsize_prefix(prefix)

    def __getattr__(self, name: str) -> Any:
        # icechunk's own methods (set_virtual_ref, sync_clear ...) are the session store's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._store, name)

    def reader(self) -> StoreReader:
        """The engine's reader of this store: icechunk's own ``get`` (nothing of the engine's to close)."""
        return own_get_reader(self, ICECHUNK_READ)

    def local_reader(self) -> Callable[..., Any] | None:
        """None: an icechunk session is read on zarr's loop, never on the calling thread."""
        return None

    def _with_store(self, store: IcechunkStore) -> InSituIcechunkStore:
        return type(self)(store, where=self.where, version=self.version)

    def __enter__(self) -> InSituIcechunkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __str__(self) -> str:
        kind, name = self.version
        return f"icechunk repository at {self.where} ({kind} {name!r})"

    def __repr__(self) -> str:
        return f"InSituIcechunkStore({self})"


def _version(branch: str | None, tag: str | None, snapshot: str | None) -> tuple[str, str]:
    """``(kind, name)`` of the one version asked for: ``branch`` ``"main"`` when none is."""
    given = {k: v for k, v in (("branch", branch), ("tag", tag), ("snapshot", snapshot)) if v is not None}
    if len(given) > 1:
        shown = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise ValueError(f"{shown}: give at most one of branch=, tag= and snapshot= (none reads branch 'main')")
    kind, name = next(iter(given.items()), ("branch", "main"))
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind}={name!r} must be a non-empty string")
    if kind == "snapshot" and not SNAPSHOT_ID.match(name):
        raise ValueError(f"snapshot={name!r} is not an icechunk snapshot id (20 characters of Crockford base32)")
    return kind, name


# What ``icechunk_store`` accepts (``validation``); at most one of branch, tag and snapshot, checked in the body
ICECHUNK_PARAMETERS: Table = {
    "repo": [Anything("a Repository, a Storage, or a local path / URL to open")],
    "branch": [Instance(str, "a branch name (str)"), None],
    "tag": [Instance(str, "a tag name (str)"), None],
    "snapshot": [Instance(str, "a snapshot id (str)"), None],
    "read_only": [Flag()],
}


@validate_params(ICECHUNK_PARAMETERS)
def icechunk_store(
    repo: Repository | Storage | str | os.PathLike[str],
    *,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    read_only: bool = True,
) -> InSituIcechunkStore:
    """Open a session on an icechunk repository at one version and return its zarr store.

    Parameters
    ----------
    repo
        An ``icechunk.Repository``, any ``icechunk.Storage`` (e.g. from
        ``icechunk.s3_storage(...)``), or a local directory (path or
        ``file://`` URL) holding the repository.
    branch, tag, snapshot
        The version to read: the tip of ``branch`` (as it is when the session
        opens: a later commit is not seen), the snapshot ``tag`` names, or
        the snapshot id ``snapshot``. At most one; none reads branch ``"main"``.
    read_only
        ``True``: a read-only session. ``False``: a writable session on
        ``branch``, creating the repository if there is none; its changes
        become a snapshot with ``store.session.commit(message)``.

    Returns
    -------
    InSituIcechunkStore
        The session's store, every call delegated to icechunk's own; it reads
        through icechunk's own ``get`` and says so (``describe()``,
        ``insitubatch inspect``). ``store.session.snapshot_id`` is the
        snapshot it reads; ``store.close()`` (or ``with store:``) closes it.

    Raises
    ------
    ImportError
        icechunk is not installed.
    FileNotFoundError
        ``read_only=True`` and no repository exists there.
    ValueError
        More than one of ``branch``, ``tag`` and ``snapshot``; a branch or
        tag the repository lacks (the message lists those it has); a
        snapshot id that is malformed or not in the repository;
        ``read_only=False`` with ``tag`` or ``snapshot`` (only a branch takes
        commits); a URL other than ``file://``.
    TypeError
        ``repo`` is none of the accepted types.
    """
    icechunk = import_icechunk()
    kind, name = _version(branch, tag, snapshot)
    if not read_only and kind != "branch":
        raise ValueError(f"read_only=False with {kind}={name!r}: only a branch takes commits; pass branch=")
    repository, where = open_repository(icechunk, repo, create=not read_only)
    if kind == "branch" and name not in repository.list_branches():
        known = sorted(repository.list_branches())
        raise ValueError(f"branch={name!r} is not a branch of the icechunk repository at {where}; it has {known}")
    if kind == "tag" and name not in repository.list_tags():
        known = sorted(repository.list_tags())
        raise ValueError(f"tag={name!r} is not a tag of the icechunk repository at {where}; it has {known}")
    if not read_only:
        session = repository.writable_session(name)
    elif kind == "snapshot":
        try:
            session = repository.readonly_session(snapshot_id=name)
        except icechunk.IcechunkError as exc:
            raise ValueError(f"snapshot={name!r} is not a snapshot of the icechunk repository at {where}") from exc
    elif kind == "tag":
        session = repository.readonly_session(tag=name)
    else:
        session = repository.readonly_session(branch=name)
    return InSituIcechunkStore(session.store, where=where, version=(kind, name))


def icechunk_session(store: Store) -> Any | None:
    """The icechunk session (or fork) behind ``store``, unwrapped from any zarr ``WrapperStore``; else ``None``."""
    inner = unwrap_store(store)
    if not type(inner).__module__.startswith("icechunk"):
        return None  # (icechunk is not imported for a store that is not its own)
    return getattr(inner, "session", None)


def snapshot_of(store: Store) -> str | None:
    """The icechunk snapshot whose bytes ``store`` reads, or ``None`` for a store that is no icechunk session.

    ``store`` may be wrapped (zarr ``WrapperStore``). A writable session
    reads its base snapshot plus what it changed since: it has a snapshot
    only while it holds no uncommitted change.

    Raises
    ------
    ValueError
        A writable session with uncommitted changes: its bytes are no
        snapshot's (the message says to commit, or to read a read-only session).
    """
    session = icechunk_session(store)
    if session is None:
        return None
    if not session.read_only and session.has_uncommitted_changes:
        raise ValueError(
            f"store={store!r} is a writable icechunk session with uncommitted changes on snapshot "
            f"{session.snapshot_id}: what it reads is no snapshot, so a persistent cache cannot tell it from "
            "that snapshot; commit first, or read a read-only session (icechunk_store(repo, snapshot=...))"
        )
    return str(session.snapshot_id)
