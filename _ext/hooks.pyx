"""Hooks Python calls by itself, written in C so that a Ctrl-C is never lost in one.

Python runs a pending signal's handler when it next enters Python code. If
that code is a hook Python called by itself (a garbage-collector callback, a
weak reference's callback, a finalizer), the KeyboardInterrupt raised there
can only be printed as "Exception ignored", and the script goes on as if the
key was never pressed. These hooks run no Python code, so a pending
interrupt waits for the caller's own code. :func:`rescue_interrupt` raises
again a Ctrl-C that was lost in someone else's Python hook.
"""

import threading

from cpython.pythread cimport PyThread_get_thread_ident

cdef extern from "Python.h":
    void PyErr_SetInterrupt()

cdef bint _collecting = False
cdef unsigned long _main_thread = threading.main_thread().ident
cdef object _next_hook = None


def note_collection(str phase, dict info):
    """The ``gc.callbacks`` hook: ``phase`` is ``"start"`` or ``"stop"``."""
    global _collecting
    _collecting = phase == "start"


def collecting():
    """True while a collection runs (in whichever thread triggered it)."""
    return _collecting


def rescue_after(hook):
    """Make :func:`rescue_interrupt` hand every other unraisable exception to ``hook`` (the one it replaces)."""
    global _next_hook
    _next_hook = hook


def rescue_interrupt(unraisable):
    """``sys.unraisablehook``: a KeyboardInterrupt lost in the main thread is raised again at its next line.

    It simulates the Ctrl-C again (the SIGINT handler runs once more), after
    this hook and whatever callback ran it have returned to the main thread's
    own code. Anything else goes to the hook this one replaced.
    """
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and PyThread_get_thread_ident() == _main_thread:
        PyErr_SetInterrupt()
        return
    if _next_hook is not None:
        _next_hook(unraisable)
