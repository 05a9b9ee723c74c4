"""Which stores insitubatch opened, so :func:`close_store` closes those and leaves a caller's own alone.

Every store factory in ``insitubatch.io`` (``obstore_store``, ``fsspec_store``,
``icechunk_store``) remembers what it built here. What insitubatch holds open
*for* a store (the engine's HTTP connections to it, the aiohttp session of a
filesystem ``fsspec_store`` made) is registered with :func:`on_close` and
closed by :func:`close_store` too.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from zarr.abc.store import Store

from ..validation import Anything, Table, validate_params

__all__ = ["close_held", "close_store", "on_close"]

# Stores insitubatch built, by id. zarr's stores define __eq__ without
# __hash__, so a WeakSet cannot hold them; a dict of weak references can, and
# each entry removes itself when its store is garbage collected.
_owned: dict[int, weakref.ref[Store]] = {}
_owned_lock = threading.Lock()


def _remember(store: Store) -> None:
    key = id(store)

    def _forget(_ref: weakref.ref[Store], key: int = key) -> None:
        with _owned_lock:
            if _owned.get(key) is _ref:
                del _owned[key]

    with _owned_lock:
        _owned[key] = weakref.ref(store, _forget)


# What close_store(store) calls besides store.close(), by store id (the engine's client of each store).
_closers: dict[int, tuple[weakref.ref[Store], list[Callable[[], None]]]] = {}


def on_close(store: Store, closer: Callable[[], None]) -> None:
    """Have :func:`close_store` call ``closer()`` for ``store`` (every time it runs; forgotten with the store)."""
    key = id(store)

    def _forget(ref: weakref.ref[Store], key: int = key) -> None:
        with _owned_lock:
            if _closers.get(key, (None,))[0] is ref:
                del _closers[key]

    with _owned_lock:
        held = _closers.get(key)
        if held is None or held[0]() is not store:
            held = _closers[key] = (weakref.ref(store, _forget), [])
        held[1].append(closer)


def close_held(store: Store) -> None:
    """Close what insitubatch holds open for ``store`` (the engine's connections to it); the store stays open.

    Each closer runs once: what registered it opens afresh when the store is read again.
    """
    with _owned_lock:
        held = _closers.pop(id(store), None)
    for closer in [] if held is None or held[0]() is not store else held[1]:
        closer()


def _take_ownership_back(store: Store) -> bool:
    """Forget ``store`` if this module built it; say whether it did."""
    with _owned_lock:
        ref = _owned.get(id(store))
        if ref is None or ref() is not store:
            return False
        del _owned[id(store)]
        return True


# What ``close_store`` accepts (``validation``)
CLOSE_PARAMETERS: Table = {"store": [Anything("any store: only one insitubatch opened is closed")]}


@validate_params(CLOSE_PARAMETERS)
def close_store(store: Store) -> None:
    """Close ``store`` if insitubatch opened it, and the engine's connections to it; leave a caller's store open.

    Closing twice does nothing more; a caller's own store stays open (only
    the engine's connections to it close, and reopen if it is read again).

    Parameters
    ----------
    store
        A store from :func:`obstore_store`, :func:`fsspec_store`,
        :func:`icechunk_store` or :func:`as_store`, or any other store.
    """
    close_held(store)
    if _take_ownership_back(store):
        store.close()
