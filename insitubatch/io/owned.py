"""Which stores insitubatch opened, so :func:`close_store` closes those and leaves a caller's own alone.

Every store factory in ``insitubatch.io`` (``obstore_store``, ``fsspec_store``,
``icechunk_store``) remembers what it built here.
"""

from __future__ import annotations

import threading
import weakref

from zarr.abc.store import Store

__all__ = ["close_store"]

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


def _take_ownership_back(store: Store) -> bool:
    """Forget ``store`` if this module built it; say whether it did."""
    with _owned_lock:
        ref = _owned.get(id(store))
        if ref is None or ref() is not store:
            return False
        del _owned[id(store)]
        return True


def close_store(store: Store) -> None:
    """Close ``store`` if insitubatch opened it; leave any other store alone.

    Closing twice, or closing a store the caller made, does nothing.

    Parameters
    ----------
    store
        A store from :func:`obstore_store`, :func:`fsspec_store`,
        :func:`icechunk_store` or :func:`as_store`, or any other store.
    """
    if _take_ownership_back(store):
        store.close()
