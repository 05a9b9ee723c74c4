"""Which HTTP client reads a store: the per-store ``client=`` setting and its process default.

``obstore_store(url, client=...)`` records the choice here; the engine's
routing (``_engine.reads.store_link``) reads it back. ``"auto"`` lets the
engine send the GETs itself where it can (``stores.wire_settings``) and leaves
every other store on obstore's client; ``"engine"`` insists on the engine's
client (a store it cannot read is refused when it is built); ``"obstore"``
always uses obstore's. A store not built by ``obstore_store`` takes the
process default: the ``client`` setting (``insitubatch.config``:
``INSITUBATCH_CLIENT``, else ``"auto"``).
"""

from __future__ import annotations

import threading
import weakref

from zarr.abc.store import Store

from .. import config
from ..config import CLIENTS

__all__ = ["client_choice", "remember_client", "resolve_client"]

# Choices by store id, each with the words that set it ("client='engine'", "INSITUBATCH_CLIENT=obstore");
# an entry goes with its store (zarr's stores cannot be weakly keyed: they define __eq__ without __hash__).
_choices: dict[int, tuple[weakref.ref[Store], str, str]] = {}
_lock = threading.Lock()


def resolve_client(client: str | None) -> tuple[str, str]:
    """``(choice, what set it)`` for a ``client=`` argument; ``None`` takes the ``client`` setting.

    Raises
    ------
    ValueError
        ``client`` (or the setting's variable, ``INSITUBATCH_CLIENT``) is not one of :data:`CLIENTS`.
    """
    if client is None:
        return config.lookup("client")
    if client not in CLIENTS:
        raise ValueError(f"client={client!r} must be one of {', '.join(repr(c) for c in CLIENTS)}")
    return client, f"client={client!r}"


def remember_client(store: Store, choice: str, source: str) -> None:
    """Record ``choice`` (set by ``source``) for ``store``; the entry goes when the store does."""
    key = id(store)

    def forget(ref: weakref.ref[Store], key: int = key, choices: dict = _choices, lock: threading.Lock = _lock) -> None:
        with lock:
            held = choices.get(key)
            if held is not None and held[0] is ref:
                del choices[key]

    with _lock:
        _choices[key] = (weakref.ref(store, forget), choice, source)


def client_choice(store: Store) -> tuple[str, str]:
    """``(choice, what set it)`` for ``store``: what ``obstore_store`` recorded, else the process default."""
    with _lock:
        held = _choices.get(id(store))
    if held is not None and held[0]() is store:
        return held[1], held[2]
    return resolve_client(None)
