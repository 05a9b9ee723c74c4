"""Which client reads a store: ``obstore_store(client=...)``, ``INSITUBATCH_CLIENT``, and what describe/inspect say."""

from __future__ import annotations

from pathlib import Path

import obstore.store
import pytest
from datasets import GROUP, check_pass, write_group
from scripted import WIRE_CLIENTS
from zarr.storage import ObjectStore

from insitubatch._engine.reads.store_link import client_for
from insitubatch._wire.backends import ObstoreBackend, StoreBackend
from insitubatch._wire.engine_client import NativeBackend
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.tools.inspect_store import inspect_store

URL = "http://127.0.0.1:9/ds.zarr"


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


def _route(store) -> tuple[str, str]:
    client = client_for(store)
    route = (client.route.client, client.route.reason)
    close_store(store)
    return route


def test_auto_reads_with_the_engine_where_it_can_and_names_why() -> None:
    assert _route(obstore_store(URL)) == ("engine", "an http store")
    client = client_for(obstore_store(URL, client="engine"))
    assert isinstance(client.backend, NativeBackend)
    headers = {"default_headers": {"authorization": "Bearer x"}}
    assert _route(obstore_store(URL, client_options=headers)) == (
        "obstore",
        "client_options['default_headers'] is set",
    )
    s3 = {"endpoint": "http://127.0.0.1:9", "region": "us-east-1"}
    assert _route(obstore_store("s3://bkt/p", **s3)) == (
        "obstore",
        "no static keys (access_key_id, secret_access_key): obstore's credential chain signs",
    )
    assert _route(obstore_store("s3://bkt/p", anonymous=True, **s3)) == ("engine", "anonymous S3")


def test_obstore_can_be_chosen_for_any_remote_store() -> None:
    store = obstore_store(URL, client="obstore")
    client = client_for(store)
    assert type(client.backend) is ObstoreBackend and client.backend.own_retries is False
    assert (client.route.client, client.route.reason) == ("obstore", "client='obstore'")
    close_store(store)


@pytest.mark.parametrize(
    ("url", "options", "named"),
    [
        (URL, {"client_options": {"default_headers": {"x-a": "b"}}}, "client_options['default_headers']"),
        (URL, {"client_options": {"proxy_url": "http://127.0.0.1:3128"}}, "client_options['proxy_url']"),
        ("s3://bkt/p", {"endpoint": "http://127.0.0.1:9", "region": "us-east-1"}, "no static keys"),
        ("s3://bkt/p", {"endpoint": "http://127.0.0.1:9", "requester_pays": True, "anonymous": False}, "S3 config"),
        ("gs://bkt/p", {}, "GCSStore"),
        ("memory://", {}, "MemoryStore"),
    ],
)
def test_engine_on_a_store_it_cannot_read_is_refused_naming_the_setting(url, options, named) -> None:
    with pytest.raises(ValueError, match=r"client='engine'.*cannot read") as info:
        obstore_store(url, client="engine", **options)
    assert named in str(info.value) and "client='auto'" in str(info.value)


def test_the_process_default_comes_from_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INSITUBATCH_CLIENT", "obstore")
    assert _route(obstore_store(URL)) == ("obstore", "INSITUBATCH_CLIENT=obstore")
    assert _route(obstore_store(URL, client="engine"))[0] == "engine"  # an explicit choice wins
    foreign = ObjectStore(obstore.store.HTTPStore.from_url(URL, client_options={"allow_http": True}))
    assert _route(foreign)[0] == "obstore"  # a store built elsewhere takes the default too
    monkeypatch.setenv("INSITUBATCH_CLIENT", "engine")
    with pytest.raises(ValueError, match="INSITUBATCH_CLIENT=engine"):
        obstore_store(URL, client_options={"default_headers": {"x-a": "b"}})
    obstore_store(str(tmp_path))  # a local store uses no HTTP client: the default does not apply
    proxied = ObjectStore(obstore.store.HTTPStore.from_url(URL, client_options={"proxy_url": "http://127.0.0.1:1"}))
    with pytest.raises(ValueError, match=r"INSITUBATCH_CLIENT=engine.*proxy_url"):
        client_for(proxied)
    monkeypatch.setenv("INSITUBATCH_CLIENT", "curl-someday")
    with pytest.raises(ValueError, match="INSITUBATCH_CLIENT='curl-someday'.*auto, engine, obstore"):
        obstore_store(URL)
    with pytest.raises(ValueError, match="client='fast' must be one of"):
        obstore_store(URL, client="fast")


def test_a_store_that_is_not_obstores_is_read_through_its_own_get(tmp_path: Path) -> None:
    class Wrapped(ObjectStore):  # not exactly zarr's ObjectStore: the engine cannot see past its get
        pass

    store = Wrapped(obstore.store.HTTPStore.from_url(URL, client_options={"allow_http": True}))
    client = client_for(store)
    assert isinstance(client.backend, StoreBackend)
    assert client.route.client == "store" and "its own get" in client.route.reason


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_describe_and_inspect_say_which_client_reads_the_store(tmp_path: Path, client: str, scripted) -> None:
    data = write_group(tmp_path)
    url = scripted(root=tmp_path).url_for(GROUP)
    info = check_pass(url, data, client=client)
    reason = "an http store" if client == "engine" else "client='obstore'"
    assert info["client"] == {"client": client, "reason": reason}
    text = inspect_store(url, storage_options={"client": client}, probe=False)
    assert f"client     {client}: {reason}" in text.splitlines()
    local = inspect_store(str(tmp_path / GROUP), probe=False)
    assert "client     local: read from files directly, no HTTP client" in local.splitlines()
