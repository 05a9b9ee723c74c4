"""What is still open when the process exits: closed first, while zarr's loop and the decode pool still run.

A script may end however it ends: return from a function that built a
dataset, ``break`` out of a loop, ``sys.exit()`` in the middle of a pass.
Python then finalizes objects late, after zarr's exit hook has stopped its
event loop, and asking zarr for its loop at that point starts a new loop
thread that never runs: the process hangs. So:

* every dataset registers here; :func:`_close_open_at_exit` closes the ones
  still open at the very start of interpreter shutdown (a ``threading``
  exit hook, which runs before non-daemon threads and executors are joined
  and long before zarr's ``atexit`` hook stops its loop);
* the process-wide hooks (that exit hook, a ``gc.callbacks`` entry and
  ``sys.unraisablehook``) are installed when the first dataset opens, not at
  import, and the last two are removed when the last open dataset closes
  (:func:`close_at_exit`, :func:`closed`). Python offers no public exit
  hook that runs before threads are joined, so that one is CPython's
  ``threading._register_atexit``; it cannot be unregistered, and does
  nothing once no dataset is open (docs/design.md, known limitations);
* finalizers (``__del__``, ``weakref.finalize``) never start a thread, an
  event loop or I/O: they call :func:`live_loop` (never :func:`zarr_loop`),
  only signal what runs, and hand closes that do I/O (a disk cache, a store)
  to :func:`close_later`, which runs them at the next ``close()`` or open on
  a user's thread, or at exit. Only a finalizer the caller's own code set
  off (a dropped iterator after ``break``), outside a garbage collection,
  closes in full (:func:`may_wait`).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._ext.hooks import collecting, note_collection, rescue_after, rescue_interrupt
from .._weak import WeakMembers
from .._zarr_compat import running_io_loop
from .loop import DECODE_THREAD_PREFIX

__all__ = [
    "close_at_exit",
    "close_later",
    "closed",
    "closing_deferred",
    "dropped",
    "exiting",
    "live_loop",
    "may_wait",
    "running_loop",
]

logger = logging.getLogger("insitubatch")

# At exit, how long closing one pass may wait for its producer thread and its tasks on the loop: a batch
# transform or a store that never returns must not keep the process from ending.
EXIT_WAIT_S = 2.0


class _Closable(Protocol):
    def close(self) -> None: ...


_open: WeakMembers[Any] = WeakMembers()  # datasets not closed yet
_later: list[Callable[[], object]] = []  # closes a finalizer handed on (they do I/O): on a user's thread or at exit
_lock = threading.Lock()
_exiting = False
_exit_hook_registered = False  # registered once, at the first open: CPython has no way to unregister it
_hooks_installed = False
_replaced: Callable[[Any], object] = sys.unraisablehook  # the unraisable-error hook ours replaced


def live_loop() -> asyncio.AbstractEventLoop | None:
    """zarr's store-IO loop if it runs now, else None; never starts one (for teardown and finalizers)."""
    return running_io_loop()


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, else None (``asyncio.get_running_loop`` raises when none)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def exiting() -> bool:
    """True once interpreter shutdown has begun (our exit hook ran, or Python is finalizing)."""
    return _exiting or sys.is_finalizing()


def may_wait() -> bool:
    """Whether a finalizer running now may close what it holds the way ``close()`` does, waiting for threads.

    Not during interpreter shutdown, and not from inside a cyclic garbage
    collection, which can start at any allocation, in any thread, with any
    lock held, nor on the event loop or a decode thread (which a pass's
    close waits for): there a finalizer only signals. A reference dropped by
    the caller's own code (``break``, ``del``, a function's return) may wait.
    """
    if collecting() or exiting() or running_loop() is not None:
        return False
    return not threading.current_thread().name.startswith(DECODE_THREAD_PREFIX)


def _install_hooks() -> None:
    """The process-wide hooks a pass needs, once (``_lock`` held).

    C hooks: one written in Python would be entered on every collection, and
    a Ctrl-C raised there is lost; and a Ctrl-C lost in anyone's Python hook
    (threading's and asyncio's weak sets drop a pass's thread and tasks in
    one) is raised again in the main thread's own code.
    """
    global _hooks_installed, _exit_hook_registered, _replaced
    if not _exit_hook_registered:
        _register_exit_hook(_close_open_at_exit)
        _exit_hook_registered = True
    if _hooks_installed:
        return
    gc.callbacks.append(note_collection)
    _replaced = sys.unraisablehook
    rescue_after(_replaced)
    sys.unraisablehook = rescue_interrupt
    _hooks_installed = True


def _remove_hooks() -> None:
    """Give the collector and ``sys.unraisablehook`` back as they were (``_lock`` held), where that is sound.

    Not from inside a collection (its "stop" would never be seen, and
    :func:`may_wait` would stay false), and ``sys.unraisablehook`` only if it
    is still ours: a hook someone installed over it keeps calling ours, which
    keeps handing on to the one it replaced.
    """
    global _hooks_installed
    if not _hooks_installed or collecting():
        return
    if note_collection in gc.callbacks:
        gc.callbacks.remove(note_collection)
    if sys.unraisablehook is rescue_interrupt:
        sys.unraisablehook = _replaced
    _hooks_installed = False


def close_at_exit(obj: _Closable) -> None:
    """Close ``obj`` at the start of interpreter shutdown if it is still alive then (held weakly).

    The first call in a process installs the hooks a pass needs (module docstring).
    """
    with _lock:
        _open.add(obj)
        _install_hooks()


def closed(obj: _Closable) -> None:
    """``obj`` closed: no longer closed at exit; the hooks go when no other dataset is open."""
    with _lock:
        _open.discard(obj)
        if not len(_open):
            _remove_hooks()


def close_later(close: Callable[[], object]) -> None:
    """Call ``close`` on a user's thread soon (the next :func:`closing_deferred`) or at exit: for finalizers."""
    with _lock:
        _later.append(close)


def dropped(close: Callable[[], object], release: Callable[[], object], later: Sequence[Callable[[], object]]) -> None:
    """A finalizer's close: ``close`` where it may wait, else ``release`` (signals only) and the closes
    that do I/O (``later``) handed to a user's thread; at interpreter exit those are left to the process's end.
    """
    if may_wait():
        close()
        return
    release()
    if not exiting():
        for each in later:
            close_later(each)


def closing_deferred() -> None:
    """Run the closes finalizers handed on; call from a user's thread (``close()``, a dataset opening)."""
    with _lock:
        pending = _later[:]
        _later.clear()
    for close in pending:
        try:
            close()
        except Exception:  # one failed close must not stop the others (nor the caller's own close)
            logger.debug("insitubatch: a deferred close failed", exc_info=True)


def _close_open_at_exit() -> None:
    global _exiting
    _exiting = True
    with _lock:
        still_open = list(_open)
    for obj in still_open:
        try:
            obj.close()
        except Exception:
            logger.debug("insitubatch: closing %r at exit failed", obj, exc_info=True)
    closing_deferred()


# threading's exit hooks run first at shutdown, newest first: before non-daemon threads are joined and
# before concurrent.futures' own hook (registered when it was imported, earlier) joins every executor's
# threads, the decode pool's included, and refuses new work. No public hook runs that early: atexit's run
# after both, so a pass still open whose producer waits on the consumer, or whose decode job waits on a
# stalled store, would hold the join for ever. Plain atexit is the fallback on a Python without it; either
# way before zarr's atexit hook (registered when zarr was imported), which stops zarr's loop.
_register_exit_hook: Callable[[Callable[[], None]], object] = getattr(threading, "_register_atexit", atexit.register)


def _forget_in_child() -> None:
    # a forked child holds copies of its parent's datasets, whose threads stayed in the parent: they are not
    # the child's to close (an inherited dataset refuses to iterate there), nor the closes handed on for them
    global _open, _later, _lock, _exiting
    _open = WeakMembers()
    _later = []
    _lock = threading.Lock()
    _exiting = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
