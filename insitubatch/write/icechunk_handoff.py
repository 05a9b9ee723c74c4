"""An icechunk transaction across scheduler tasks: forks handed out and back through a shared store.

A SLURM array, a Kubernetes indexed Job or torchrun ranks have no Python
process that outlives the tasks to hand them forks and take them back, so the
transaction travels through a *handoff*: a directory on a shared filesystem
or a prefix in a bucket (any zarr store; a path or URL opens with
``obstore_store``). The coordinator writes the base fork there
(``tx.hand_off(handoff)``); each task writes its slots through
``with icechunk_fork(handoff) as store:`` and, when every writer in it closed
cleanly, saves its fork there, named by its slots (a retried task replaces its
own earlier fork); afterwards ``IcechunkTransaction.collect(repo, handoff)``
merges every saved fork into a transaction on the branch's tip, which commits
once and clears the handoff.

Layout of a handoff: ``transaction.json`` (branch and base snapshot),
``base.fork`` and ``forks/<slots>.fork``, forks pickled as icechunk pickles
them. Unpickling runs code: a handoff must be as trusted as the job itself.
"""

from __future__ import annotations

import json
import os
import pickle
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from zarr.abc.store import Store
from zarr.buffer import default_buffer_prototype

from .._zarr_compat import sync
from ..stores.icechunk_stores import import_icechunk
from .claims import range_name
from .icechunk_changes import ForkChanges

if TYPE_CHECKING:
    from icechunk import IcechunkStore

__all__ = ["clear_handoff", "handoff_store", "icechunk_fork", "read_transaction", "saved_forks", "write_transaction"]

# What a handoff holds (see the module docstring); bump HANDOFF_FORMAT when its meaning changes.
HANDOFF_FORMAT = 1
TRANSACTION_KEY = "transaction.json"
BASE_KEY = "base.fork"
FORKS_PREFIX = "forks/"
FORK_SUFFIX = ".fork"


def handoff_store(handoff: Store | str | os.PathLike[str]) -> Store:
    """The zarr store of a handoff: a store as given, a path or URL opened writable with ``obstore_store``."""
    if isinstance(handoff, Store):
        return handoff
    if isinstance(handoff, (str, os.PathLike)):
        from ..stores.obstore_stores import obstore_store

        return obstore_store(handoff, read_only=False)
    raise TypeError(f"handoff must be a zarr Store, a path or a URL, got {type(handoff).__name__}")


def _get(store: Store, key: str) -> bytes | None:
    found = sync(store.get(key, default_buffer_prototype()))
    return None if found is None else found.to_bytes()


def _set(store: Store, key: str, data: bytes) -> None:
    sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))


async def _keys(store: Store, prefix: str) -> list[str]:
    return sorted([key async for key in store.list_prefix(prefix)])


def _transaction(store: Store) -> dict[str, Any]:
    raw = _get(store, TRANSACTION_KEY)
    if raw is None:
        raise FileNotFoundError(
            f"handoff {store!r} holds no {TRANSACTION_KEY}: no transaction was handed off there "
            "(tx.hand_off(handoff)), or it was committed and cleared"
        )
    record = json.loads(raw)
    if record.get("format") != HANDOFF_FORMAT:
        raise ValueError(
            f"handoff {store!r} is format {record.get('format')!r}; this insitubatch reads {HANDOFF_FORMAT}"
        )
    return dict(record)


def write_transaction(store: Store, fork: Any, branch: str, base: str) -> None:
    """Hand off a transaction on ``branch`` from snapshot ``base``: its base ``fork`` and what it is.

    Raises
    ------
    FileExistsError
        ``store`` already holds a transaction that was not collected and committed.
    """
    if _get(store, TRANSACTION_KEY) is not None:
        raise FileExistsError(
            f"handoff {store!r} already holds a transaction; collect and commit it, or clear it "
            "(clear_handoff) before handing off another"
        )
    _set(store, BASE_KEY, pickle.dumps(fork))
    _set(store, TRANSACTION_KEY, json.dumps({"format": HANDOFF_FORMAT, "branch": branch, "base": base}).encode())


def read_transaction(store: Store) -> tuple[str, str]:
    """``(branch, base snapshot)`` of the transaction handed off at ``store``."""
    record = _transaction(store)
    return str(record["branch"]), str(record["base"])


def saved_forks(store: Store) -> Iterator[Any]:
    """The forks the tasks saved at ``store``, in the order of their names (by slot)."""
    for key in sync(_keys(store, FORKS_PREFIX)):
        if key.endswith(FORK_SUFFIX):
            raw = _get(store, key)
            if raw is not None:
                yield pickle.loads(raw)


@contextmanager
def icechunk_fork(handoff: Store | str | os.PathLike[str]) -> Iterator[IcechunkStore]:
    """A scheduler task's store: a fork of the handed-off transaction, saved back when the block ends cleanly.

    Open one ``SlotWriter`` per assigned slot on the store it yields. On a
    clean exit the fork is saved as ``forks/<slots>.fork``; if the block
    raises (or the process dies) nothing is saved, and the task's slots stay
    unwritten for the next plan.

    Raises
    ------
    FileNotFoundError
        No transaction was handed off at ``handoff``.
    """
    import_icechunk()  # (and its exit hook: a task that exits cleanly must not abort at shutdown)
    store = handoff_store(handoff)
    _transaction(store)
    raw = _get(store, BASE_KEY)
    if raw is None:
        raise FileNotFoundError(f"handoff {store!r} holds no {BASE_KEY}")
    fork = pickle.loads(raw)
    yield fork.store
    changes = ForkChanges.of(fork.status())
    if changes.empty:
        return
    name = "_".join(range_name(a, b) for a, b in changes.slots) if changes.slots else uuid.uuid4().hex
    _set(store, f"{FORKS_PREFIX}{name}{FORK_SUFFIX}", pickle.dumps(fork))


def clear_handoff(handoff: Store | str | os.PathLike[str]) -> None:
    """Delete what a handoff holds: its transaction, its base fork and every saved fork."""
    store = handoff_store(handoff)
    for key in [TRANSACTION_KEY, BASE_KEY, *sync(_keys(store, FORKS_PREFIX))]:
        sync(store.delete(key))
