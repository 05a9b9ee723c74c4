"""Stores: every URL kind against a real backend (moto S3 and an HTTP server on loopback)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import obstore
import pytest
import zarr
import zarr.storage
from obstore.store import AzureStore, GCSStore, HTTPStore, LocalStore, MemoryStore, S3Store
from servers import S3_KEY_ID, S3_REGION, S3_SECRET

from insitubatch.stores.fsspec_stores import fsspec_store, icechunk_store
from insitubatch.stores.obstore_stores import as_store, obstore_store
from insitubatch.stores.owned import close_store

if TYPE_CHECKING:
    from servers import HTTPFileServer, S3Server


def _data(shape: tuple[int, ...], dtype: str = "f4") -> np.ndarray:
    return (np.arange(np.prod(shape)) * 0.5).astype(dtype).reshape(shape)


def _write(store: zarr.abc.store.Store, name: str, data: np.ndarray, **kwargs: object) -> None:
    array = zarr.create_array(store, name=name, shape=data.shape, dtype=data.dtype, **kwargs)
    array[...] = data


def _read(store: zarr.abc.store.Store, name: str) -> np.ndarray:
    return zarr.open_array(store, path=name, mode="r")[...]


def _raw_keys(s3_server: S3Server, bucket: str) -> list[str]:
    """Every object key in ``bucket``, listed by obstore directly (no prefix)."""
    raw = S3Store(
        bucket,
        endpoint=s3_server.endpoint,
        access_key_id=S3_KEY_ID,
        secret_access_key=S3_SECRET,
        region=S3_REGION,
        client_options={"allow_http": True},
    )
    return sorted(meta["path"] for batch in obstore.list(raw) for meta in batch)


# --- S3 on loopback -----------------------------------------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_s3_round_trip_lands_under_prefix(s3_server: S3Server, s3_bucket: str, zarr_format: int) -> None:
    url = f"s3://{s3_bucket}/runs/exp-1"
    data = _data((10, 7))
    writer = obstore_store(url, **s3_server.client_options())
    _write(writer, "temp", data, chunks=(3, 4), zarr_format=zarr_format)

    reader = obstore_store(url, read_only=True, **s3_server.client_options())
    assert isinstance(reader.store, S3Store)
    assert reader.store.prefix == "runs/exp-1"
    np.testing.assert_array_equal(_read(reader, "temp"), data)

    keys = _raw_keys(s3_server, s3_bucket)
    metadata = "runs/exp-1/temp/zarr.json" if zarr_format == 3 else "runs/exp-1/temp/.zarray"
    assert metadata in keys
    assert all(key.startswith("runs/exp-1/") for key in keys)
    # 10x7 in 3x4 chunks is 4x2 chunks, every one written
    names = [key.rsplit("/", 1)[1] for key in keys if key.startswith("runs/exp-1/temp/")]
    assert len([name for name in names if not name.startswith((".", "zarr"))]) == 4 * 2


def test_s3_bucket_root_without_prefix(s3_server: S3Server, s3_bucket: str) -> None:
    store = obstore_store(f"s3://{s3_bucket}", **s3_server.client_options())
    assert store.store.prefix is None
    _write(store, "x", _data((4,)), chunks=(2,))
    assert "x/zarr.json" in _raw_keys(s3_server, s3_bucket)


def test_s3_allow_http_follows_a_plain_http_endpoint(s3_server: S3Server, s3_bucket: str) -> None:
    options = s3_server.client_options()
    options.pop("allow_http")
    store = obstore_store(f"s3://{s3_bucket}/p", **options)
    assert store.store.client_options["allow_http"] == "true"
    _write(store, "x", _data((5,)), chunks=(2,))
    np.testing.assert_array_equal(_read(store, "x"), _data((5,)))


def test_s3_requester_pays_is_sent_and_accepted(s3_server: S3Server, s3_bucket: str) -> None:
    store = obstore_store(f"s3://{s3_bucket}/rp", requester_pays=True, **s3_server.client_options())
    assert store.store.config["request_payer"] == "true"
    _write(store, "x", _data((6,)), chunks=(4,))
    np.testing.assert_array_equal(_read(store, "x"), _data((6,)))


def test_s3_options_reach_obstore() -> None:
    store = obstore_store(
        "s3://some-bucket/a/b/",
        anonymous=True,
        region="eu-west-1",
        endpoint="https://objects.example.invalid",
        retry={"max_retries": 2},
        client_options={"timeout": "5s"},
        virtual_hosted_style_request=False,
    )
    config = store.store.config
    assert config["skip_signature"] == "true"
    assert config["region"] == "eu-west-1"
    assert config["endpoint"] == "https://objects.example.invalid"
    assert store.store.prefix == "a/b"
    assert store.store.retry_config["max_retries"] == 2
    assert "allow_http" not in store.store.client_options


def test_s3_endpoint_from_the_environment_allows_plain_http(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_ENDPOINT_URL=http://... (MinIO, an emulator) works without allow_http, as an endpoint= would."""
    options = s3_server.client_options()
    _write(obstore_store(f"s3://{s3_bucket}/env", **options), "x", _data((5,)), chunks=(2,))
    monkeypatch.setenv("AWS_ENDPOINT_URL", str(options["endpoint"]))
    monkeypatch.setenv("AWS_REGION", str(options["region"]))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(options["access_key_id"]))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(options["secret_access_key"]))
    store = obstore_store(f"s3://{s3_bucket}/env", read_only=True)
    assert store.store.client_options["allow_http"] == "true"
    np.testing.assert_array_equal(_read(store, "x"), _data((5,)))
    monkeypatch.setenv("AWS_ALLOW_HTTP", "false")
    assert "allow_http" not in obstore_store(f"s3://{s3_bucket}/env").store.client_options


def test_read_only_s3_store_refuses_writes(s3_server: S3Server, s3_bucket: str) -> None:
    store = obstore_store(f"s3://{s3_bucket}/ro", read_only=True, **s3_server.client_options())
    assert store.read_only
    with pytest.raises(ValueError, match="read-only"):
        _write(store, "x", _data((4,)), chunks=(2,))
    assert _raw_keys(s3_server, s3_bucket) == []


# --- memory, file:// and plain paths -------------------------------------------


def test_memory_round_trip_and_each_call_is_fresh() -> None:
    store = obstore_store("memory://")
    assert isinstance(store.store, MemoryStore)
    _write(store, "m", _data((3, 3)), chunks=(2, 2))
    np.testing.assert_array_equal(_read(store, "m"), _data((3, 3)))
    with pytest.raises(FileNotFoundError):
        _read(obstore_store("memory://"), "m")


def test_memory_url_with_a_path_is_refused() -> None:
    with pytest.raises(ValueError, match="memory:// takes no path"):
        obstore_store("memory://shared/name")


def test_file_url_round_trip_creates_the_directory(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "store dir"
    store = obstore_store(target.as_uri())
    assert isinstance(store.store, LocalStore)
    assert target.is_dir()
    _write(store, "v", _data((5, 4)), chunks=(2, 3))
    assert (target / "v" / "zarr.json").is_file()
    reader = obstore_store(target.as_uri(), read_only=True)
    np.testing.assert_array_equal(_read(reader, "v"), _data((5, 4)))


def test_absolute_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(obstore_store(tmp_path / "abs"), "v", _data((4,)), chunks=(3,))
    np.testing.assert_array_equal(_read(obstore_store(str(tmp_path / "abs"), read_only=True), "v"), _data((4,)))

    monkeypatch.chdir(tmp_path)
    _write(obstore_store("rel/store"), "v", _data((6,)), chunks=(4,))
    assert (tmp_path / "rel" / "store" / "v" / "zarr.json").is_file()
    np.testing.assert_array_equal(_read(obstore_store("rel/store", read_only=True), "v"), _data((6,)))


def test_anonymous_is_accepted_where_nothing_is_signed(tmp_path: Path) -> None:
    """One line reads a public bucket and a local copy: anonymous=True is a no-op on a path or memory://."""
    _write(obstore_store(tmp_path / "d"), "v", _data((4,)), chunks=(3,))
    for url in (str(tmp_path / "d"), (tmp_path / "d").as_uri()):
        np.testing.assert_array_equal(_read(obstore_store(url, anonymous=True, read_only=True), "v"), _data((4,)))
    assert isinstance(obstore_store("memory://", anonymous=True).store, MemoryStore)
    with pytest.raises(ValueError, match="options that apply there: anonymous"):
        obstore_store(tmp_path / "d", endpoint="http://127.0.0.1:9")


def test_read_only_local_store_refuses_writes(tmp_path: Path) -> None:
    store = obstore_store(tmp_path, read_only=True)
    with pytest.raises(ValueError, match="read-only"):
        _write(store, "v", _data((4,)), chunks=(2,))
    assert list(tmp_path.iterdir()) == []


def test_read_only_missing_directory_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        obstore_store(missing, read_only=True)
    assert not missing.exists()


def test_a_file_is_not_a_store_directory(tmp_path: Path) -> None:
    afile = tmp_path / "f.txt"
    afile.write_text("x")
    with pytest.raises(NotADirectoryError, match="f.txt"):
        obstore_store(afile)


def test_file_url_with_a_host_is_refused() -> None:
    with pytest.raises(ValueError, match="names host 'server'"):
        obstore_store("file://server/share/data")


# --- HTTP on loopback ----------------------------------------------------------


def test_http_reads_v3_array_with_range_requests(http_server: HTTPFileServer) -> None:
    data = _data((12, 10), "i4")
    local = zarr.storage.LocalStore(http_server.root / "site" / "arr.zarr")
    # sharded, so a read fetches the shard index with a suffix Range request;
    # the last row of shards is never written and must read as the fill value
    _write(local, "grid", data[:8], chunks=(2, 5), shards=(4, 10), fill_value=-1)
    zarr.open_array(local, path="grid", mode="r+").resize((12, 10))

    store = obstore_store(f"{http_server.url}/site/arr.zarr", read_only=True)
    assert isinstance(store.store, HTTPStore)
    assert store.store.client_options["allow_http"] == "true"
    expected = np.full((12, 10), -1, dtype="i4")
    expected[:8] = data[:8]
    np.testing.assert_array_equal(_read(store, "grid"), expected)

    # one inner chunk of a shard: the shard index, then that chunk, both by Range
    http_server.requests.clear()
    array = zarr.open_array(store, path="grid", mode="r")
    np.testing.assert_array_equal(array[4:6, 5:10], data[4:6, 5:10])
    ranges = [r for method, _, r in http_server.requests if method == "GET" and r is not None]
    assert len(ranges) >= 2, http_server.requests
    assert all(path.startswith("/site/arr.zarr/") for _, path, _ in http_server.requests)


@pytest.mark.parametrize(
    "option",
    [
        {"requester_pays": True},
        {"endpoint": "http://127.0.0.1:1"},
        {"region": "us-east-1"},
        {"access_key_id": "k"},
        {"allow_http": False},
    ],
)
def test_http_refuses_options_it_cannot_use(option: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(option))):
        obstore_store("http://127.0.0.1:1/data", **option)


def test_https_store_is_anonymous_and_https_only() -> None:
    store = obstore_store("https://data.example.invalid/a/b", anonymous=True)
    assert isinstance(store.store, HTTPStore)
    assert store.store.url == "https://data.example.invalid/a/b"
    assert not (store.store.client_options or {}).get("allow_http")


# --- GCS and Azure: construction only, nothing is sent ---------------------------


def test_gcs_anonymous_and_prefix() -> None:
    store = obstore_store("gs://public-bucket/era5/v1", anonymous=True, read_only=True)
    assert isinstance(store.store, GCSStore)
    assert store.store.prefix == "era5/v1"
    assert store.store.config["skip_signature"] == "true"
    assert store.store.config["bucket"] == "public-bucket"


def test_gcs_requester_pays_names_the_billing_project() -> None:
    store = obstore_store(
        "gcs://paid-bucket/x",
        requester_pays="my-project",
        client_options={"default_headers": {"x-extra": "1"}},
        endpoint="http://127.0.0.1:4443",
    )
    headers = store.store.client_options["default_headers"]
    assert headers["x-goog-user-project"] in ("my-project", b"my-project")
    assert headers["x-extra"] in ("1", b"1")
    assert store.store.config["base_url"] == "http://127.0.0.1:4443"
    assert store.store.client_options["allow_http"] == "true"
    with pytest.raises(ValueError, match="billing-project"):
        obstore_store("gs://paid-bucket/x", requester_pays=True)
    with pytest.raises(ValueError, match="region"):
        obstore_store("gs://b/x", region="us-central1")


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("az://container/path/to", {"account_name": "acct"}),
        ("azure://container/path/to", {"account_name": "acct"}),
        ("abfs://container@acct.dfs.core.windows.net/path/to", {}),
        ("abfss://container@acct.dfs.core.windows.net/path/to", {}),
    ],
)
def test_azure_anonymous_and_prefix(url: str, options: dict[str, str]) -> None:
    store = obstore_store(url, anonymous=True, **options)
    assert isinstance(store.store, AzureStore)
    assert store.store.prefix == "path/to"
    assert store.store.config["skip_signature"] == "true"
    assert store.store.config["container_name"] == "container"
    assert store.store.config["account_name"] == "acct"
    with pytest.raises(ValueError, match="requester_pays"):
        obstore_store(url, requester_pays=True, **options)


def test_azure_without_account_is_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="az://container/p"):
        obstore_store("az://container/p")


# --- errors --------------------------------------------------------------------


def test_unknown_scheme_names_url_and_valid_schemes() -> None:
    with pytest.raises(ValueError) as info:
        obstore_store("ftp://host/data")
    message = str(info.value)
    assert "ftp://host/data" in message
    for scheme in ("file://", "memory://", "s3://", "gs://", "az://", "abfs://", "http://", "https://"):
        assert scheme in message


@pytest.mark.parametrize(
    ("url", "kwargs", "match"),
    [
        ("s3://b/p", {"anonymous": True, "requester_pays": True}, "cannot be unsigned"),
        ("s3://b/p", {"requester_pays": "project"}, "must be True or False"),
        ("s3://b/p", {"anonymous": True, "skip_signature": True}, "give it once"),
        ("s3://b/p", {"allow_http": True, "client_options": {"allow_http": True}}, "give it once"),
        ("s3://b/p", {"endpoint": "http://127.0.0.1:9", "allow_http": False}, "contradicts"),
        ("s3://b/p", {"endpoint": "127.0.0.1:9"}, "must start with http"),
        ("s3://b/p", {"not_an_option": 1}, "not_an_option"),
        ("s3://b/p", {"retry": {"max_retry": 3}}, "max_retry"),
        ("s3://", {}, "names no bucket"),
        ("memory://", {"region": "us-east-1"}, "region"),
        ("/tmp/x", {"region": "us-east-1"}, "region"),
        ("", {}, "empty"),
    ],
)
def test_bad_options_raise_value_error(url: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        obstore_store(url, **kwargs)


def test_url_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="bytes"):
        obstore_store(b"s3://b/p")  # type: ignore[arg-type]


# --- as_store and close_store --------------------------------------------------


def test_as_store_passes_a_store_through_and_opens_urls(tmp_path: Path) -> None:
    user = zarr.storage.MemoryStore()
    assert as_store(user) is user
    for obj in (tmp_path, str(tmp_path), tmp_path.as_uri()):
        store = as_store(obj)
        assert isinstance(store, zarr.storage.ObjectStore)
        assert store.read_only
    with pytest.raises(TypeError, match=r"int.*zarr\.abc\.store\.Store"):
        as_store(42)  # type: ignore[arg-type]


def test_close_store_is_closing_the_store() -> None:
    user = zarr.storage.MemoryStore()
    _write(user, "u", _data((4,)), chunks=(2,))
    assert as_store(user) is user
    close_store(user)  # a thin alias of user.close(), for the code and docs that call it
    assert not user._is_open


def test_close_store_closes_ours_once(tmp_path: Path) -> None:
    ours = obstore_store(tmp_path)
    _write(ours, "o", _data((4,)), chunks=(2,))
    assert ours._is_open
    close_store(ours)
    assert not ours._is_open
    close_store(ours)  # idempotent
    assert not ours._is_open


def test_closing_one_store_leaves_another_over_the_same_backend_open(tmp_path: Path) -> None:
    ours = obstore_store(tmp_path)
    user = zarr.storage.ObjectStore(LocalStore(tmp_path))
    _write(user, "x", _data((3,)), chunks=(2,))
    close_store(ours)
    assert user._is_open and not ours._is_open
    np.testing.assert_array_equal(_read(user, "x"), _data((3,)))


# --- fsspec ---------------------------------------------------------------------


def test_fsspec_memory_round_trip() -> None:
    pytest.importorskip("fsspec")
    url = f"memory://insitubatch-tests/{uuid.uuid4().hex}"
    store = fsspec_store(url)
    assert isinstance(store, zarr.storage.FsspecStore)
    _write(store, "f", _data((6, 2)), chunks=(4, 2))
    np.testing.assert_array_equal(_read(fsspec_store(url, read_only=True), "f"), _data((6, 2)))
    close_store(store)
    assert not store._is_open


@pytest.mark.parametrize("as_url", [True, False])
def test_fsspec_local_round_trip(tmp_path: Path, as_url: bool) -> None:
    pytest.importorskip("fsspec")
    target = tmp_path / "fs" / "store"
    location = target.as_uri() if as_url else str(target)
    _write(fsspec_store(location), "f", _data((5,)), chunks=(2,))
    assert (target / "f" / "zarr.json").is_file()
    reader = fsspec_store(location, read_only=True)
    np.testing.assert_array_equal(_read(reader, "f"), _data((5,)))
    with pytest.raises(ValueError, match="read-only"):
        _write(reader, "g", _data((5,)), chunks=(2,))


def test_fsspec_missing_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(ImportError, match=r"insitubatch\[fsspec\]"):
        fsspec_store("memory://x")


# --- icechunk -------------------------------------------------------------------


def test_icechunk_write_commit_read(tmp_path: Path) -> None:
    pytest.importorskip("icechunk")
    repo = tmp_path / "repo"
    data = _data((6, 4), "f8")
    writer = icechunk_store(repo, read_only=False)
    assert not writer.read_only
    _write(writer, "t2m", data, chunks=(3, 2))
    writer.session.commit("write t2m")
    close_store(writer)

    reader = icechunk_store(repo.as_uri())
    assert reader.read_only
    np.testing.assert_array_equal(_read(reader, "t2m"), data)
    with pytest.raises(ValueError, match="read-only|read only|readonly"):
        _write(reader, "other", data, chunks=(3, 2))


def test_icechunk_errors(tmp_path: Path) -> None:
    pytest.importorskip("icechunk")
    with pytest.raises(FileNotFoundError, match="no icechunk repository"):
        icechunk_store(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()
    with pytest.raises(ValueError, match="icechunk.Storage"):
        icechunk_store("s3://bucket/repo")
    with pytest.raises(ValueError, match="branch"):
        icechunk_store(tmp_path, branch="")
    with pytest.raises(TypeError, match="int"):
        icechunk_store(3)  # type: ignore[arg-type]


def test_icechunk_missing_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "icechunk", None)
    with pytest.raises(ImportError, match=r"insitubatch\[icechunk\]"):
        icechunk_store("/tmp/anything")
