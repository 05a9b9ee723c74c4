"""Whether obstore can still answer in this process: its runtime's threads do not survive ``fork``.

obstore runs every request on a tokio runtime whose worker threads start
with the process's first request (one runtime for blocking calls, one for
async ones) and never stop. ``fork`` copies only the thread that forks, so a
child forked after its parent's first obstore request holds a runtime with
no workers: every request the child makes through obstore, on a store it
inherited or on one it builds anew, waits for ever (obstore 0.12: a parent's
blocking ``get`` leaves the child's blocking ``get`` hanging, an async one
its async ``get``; a parent that never sent a request leaves the child able
to). Python can neither restart that runtime nor ask whether it runs.

So at every fork the parent looks for the runtime's threads by name
(``os.register_at_fork``; Linux lists a process's threads and their names
under ``/proc/self/task``, and tokio names its threads ``tokio-...``), and the
child remembers what it found, for its own children too. Where the threads
cannot be listed, a fork is taken to have left the runtime dead: a clear
error, never a hang. :func:`refuse_dead_obstore` raises :class:`ForkError` at
a store's first use in such a child, before anything waits for an answer.

The store ``obstore_store`` builds (``stores.object_store``) asks here before
it sends anything through obstore.
"""

from __future__ import annotations

import os

from ..errors import ForkError

__all__ = ["FORK_WAY_OUT", "obstore_usable", "refuse_dead_obstore"]

# What a user does instead, named in every ForkError (the start methods that begin a fresh interpreter).
FORK_WAY_OUT = (
    'start the worker processes with multiprocessing.get_context("forkserver") or get_context("spawn") '
    '(torch: DataLoader(..., multiprocessing_context="spawn")), or create the pool before the parent reads'
)
# The name tokio gives its runtime's threads (worker and blocking ones), as Linux shows it in ``comm``.
_TOKIO_THREAD_PREFIX = b"tokio-"
_TASKS = "/proc/self/task"

_runtime_at_fork = False  # set in the parent just before a fork, read by the child
_dead = False  # this process was forked after obstore's runtime started (in it or in an ancestor)


def _runtime_threads() -> bool:
    """Whether this process runs threads of a tokio runtime (True when they cannot be listed)."""
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"{_TASKS}/{task}/comm", "rb") as f:
                if f.read().startswith(_TOKIO_THREAD_PREFIX):
                    return True
        except OSError:  # the thread ended while we looked
            continue
    return False


def _before_fork() -> None:
    global _runtime_at_fork
    _runtime_at_fork = _runtime_threads()


def _in_child() -> None:
    global _dead
    _dead = _dead or _runtime_at_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def obstore_usable() -> bool:
    """False in a process forked after obstore's runtime started (there, obstore never answers)."""
    return not _dead


def refuse_dead_obstore(store: object, key: str | None = None) -> None:
    """Raise :class:`ForkError` naming ``store`` (and ``key``) if obstore cannot answer in this process; else nothing.

    Cheap where obstore answers (one flag), so the engine checks it on every request it sends through obstore.

    Raises
    ------
    ForkError
        This process was forked after obstore's runtime started in its parent.
    """
    if _dead:
        what = f"the store {store}" if key is None else f"reading {key!r} from {store}"
        raise ForkError(
            f"{what} needs obstore, which cannot answer in this process: it was forked (a fork "
            "multiprocessing start method, or os.fork) after its parent had read through obstore, and "
            "obstore's runtime threads do not survive fork. To read here, "
            f"{FORK_WAY_OUT}"
        )
