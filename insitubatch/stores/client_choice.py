"""Which HTTP client reads a store: the per-store ``client=`` setting and its process default.

``obstore_store(url, client=...)`` resolves the choice here and the store it
builds carries it (``ForkSafeObjectStore.client_setting``, kept through
pickling); the engine's routing (``_engine.reads.store_link``) asks the store.
``"auto"`` lets the engine send the GETs itself where it can
(``stores.wire_settings``) and leaves every other store on obstore's client;
``"engine"`` insists on the engine's client (a store it cannot read is
refused when it is built); ``"obstore"`` always uses obstore's. A store that
carries no choice takes the process default: the ``client`` setting
(``insitubatch.config``: ``INSITUBATCH_CLIENT``, else ``"auto"``), read when
the engine first reads the store.
"""

from __future__ import annotations

from .. import config
from ..config import CLIENTS

__all__ = ["resolve_client"]


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
