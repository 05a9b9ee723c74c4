"""``close_store``: closing a store, under the name the loader's users and docs have always called it by.

Every store insitubatch builds closes what it holds with it (the engine's
connections, an fsspec filesystem's session) in its own ``close()``, so
:func:`close_store` is ``store.close()``, kept because user code and the
docs call it.
"""

from __future__ import annotations

from zarr.abc.store import Store

from ..validation import Anything, Table, validate_params

__all__ = ["close_store"]

# What ``close_store`` accepts (``validation``)
CLOSE_PARAMETERS: Table = {"store": [Anything("any zarr store: it is closed")]}


@validate_params(CLOSE_PARAMETERS)
def close_store(store: Store) -> None:
    """Close ``store``: the same as ``store.close()`` (and leaving ``with store:``).

    A store from :func:`obstore_store`, :func:`fsspec_store`,
    :func:`icechunk_store` or :func:`as_store` closes the engine's
    connections to it and what it opened; closing twice does nothing more,
    and a store read again after it closed opens its connections afresh.

    Parameters
    ----------
    store
        The store to close.
    """
    store.close()
