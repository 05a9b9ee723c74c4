"""A store carries its settings: the ``client=`` choice travels with the store object, not in a side table."""

from __future__ import annotations

import pickle

import pytest

from insitubatch._engine.reads.store_link import client_for
from insitubatch.stores.object_store import ForkSafeObjectStore
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store

URL = "http://127.0.0.1:9/ds.zarr"  # nothing listens: building a store or its client sends no request


@pytest.fixture(autouse=True)
def _default_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INSITUBATCH_CLIENT", raising=False)


def _route(store: ForkSafeObjectStore) -> tuple[str, str]:
    client = client_for(store)
    try:
        return client.route.client, client.route.reason
    finally:
        close_store(store)


def test_the_store_carries_its_client_choice_and_what_set_it() -> None:
    store = obstore_store(URL, client="obstore")
    assert store.client_setting == ("obstore", "client='obstore'")
    assert _route(store) == ("obstore", "client='obstore'")


def test_the_choice_survives_pickling_and_a_read_only_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker process unpickles the store: the choice made in the parent still holds there, not the worker's default
    store = obstore_store(URL, client="obstore")
    monkeypatch.setenv("INSITUBATCH_CLIENT", "engine")
    copy = pickle.loads(pickle.dumps(store))
    assert copy is not store and copy.client_setting == ("obstore", "client='obstore'")
    assert _route(copy) == ("obstore", "client='obstore'")
    read_only = store.with_read_only(True)
    assert read_only.read_only and read_only.client_setting == store.client_setting
    assert _route(read_only)[0] == "obstore"


def test_a_store_built_without_a_choice_takes_the_default_when_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    built_elsewhere = ForkSafeObjectStore(obstore_store(URL).store)
    monkeypatch.setenv("INSITUBATCH_CLIENT", "obstore")
    assert built_elsewhere.client_setting == ("obstore", "INSITUBATCH_CLIENT=obstore")
    client, reason = _route(built_elsewhere)
    # built with no retry-free twin, it keeps obstore's own retries, and its route says so
    assert client == "obstore" and reason.startswith("INSITUBATCH_CLIENT=obstore; ") and "own retries" in reason


def test_closing_the_store_closes_its_reader_and_a_later_read_builds_a_fresh_one() -> None:
    with obstore_store(URL) as store:
        reader = store.reader()
        assert store.reader() is reader  # one reader per store while it is open, held by the store
        assert client_for(store).backend is reader.backend  # the engine reads with the store's own reader
    # leaving the block closed the reader (its connections) too: a later read builds a fresh one
    fresh = store.reader()
    assert fresh is not reader
    store.close()
    assert store.reader() is not fresh
    close_store(store)
