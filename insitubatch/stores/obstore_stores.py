"""Open zarr stores from URLs through obstore, the hot path (fsspec and icechunk: ``stores.fsspec_stores``).

Every store built here is a zarr ``ObjectStore`` (``ForkSafeObjectStore``),
so zarr itself reads through it unchanged, and it carries how the engine
reads it: its client setting, a retry-free twin of its obstore store built
from the same arguments, and the reader the engine asks for (``stores.reading``).

No function here sends a request: construction only parses options, and the
first byte moves when zarr (or the loader) reads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import obstore.exceptions
from obstore.store import AzureStore, GCSStore, HTTPStore, LocalStore, MemoryStore, S3Store
from zarr.abc.store import Store
from zarr.storage import ObjectStore

from .._zarr_compat import unwrap_store
from ..config import parse_flag
from ..validation import Anything, Flag, Instance, Table, validate_params
from .client_choice import resolve_client
from .object_store import ForkSafeObjectStore
from .obstore_runtime import obstore_usable
from .options import (
    DEFAULT_CLIENT_OPTIONS,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_RETRIES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_RETRY,
    DEFAULT_RETRY_TIMEOUT,
    DEFAULT_TIMEOUT,
    NO_RETRIES,
    merge_config,
    merged_client_options,
    reject_options,
    retry_config_with,
)
from .wire_settings import engine_settings

__all__ = [
    "DEFAULT_CLIENT_OPTIONS",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_RETRY",
    "DEFAULT_RETRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "STORE_FAILURES",
    "as_store",
    "lists_keys",
    "obstore_store",
]

# URL schemes obstore_store understands, grouped by the obstore store they build.
_LOCAL_SCHEMES = ("file",)
_MEMORY_SCHEMES = ("memory",)
_S3_SCHEMES = ("s3", "s3a")
_GCS_SCHEMES = ("gs", "gcs")
_AZURE_SCHEMES = ("az", "azure", "abfs", "abfss")
_HTTP_SCHEMES = ("http", "https")
_UNSIGNED_ONLY = ("anonymous",)  # asks for no signature, which a local or memory:// store never sends
_VALID_SCHEMES = _LOCAL_SCHEMES + _MEMORY_SCHEMES + _S3_SCHEMES + _GCS_SCHEMES + _AZURE_SCHEMES + _HTTP_SCHEMES

# What a store built here raises when a request fails: OSError and its kin (a missing key, a timeout), or obstore's
# own errors for the rest (a refused precondition, a configuration obstore rejects).
STORE_FAILURES: tuple[type[BaseException], ...] = (OSError, obstore.exceptions.BaseError)

# GCS bills a requester-pays read to the project named in this header; obstore
# has no config key for it (developmentseed/obstore#546), only default headers.
_GCS_USER_PROJECT_HEADER = "x-goog-user-project"


def split_scheme(url: str) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for a URL, ``(None, url)`` for a plain path."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None, url
    return scheme.lower(), rest


def lists_keys(store: Store) -> bool:
    """Whether ``store`` can list its keys: any store but one over an HTTP endpoint (obstore's ``HTTPStore``).

    ``store`` may be wrapped (zarr ``WrapperStore``s); asking an HTTP
    endpoint to list would only cost its retries to learn nothing.
    """
    inner = unwrap_store(store)
    return not isinstance(getattr(inner, "store", None), HTTPStore)


def _unknown_scheme(url: str, scheme: str) -> ValueError:
    valid = ", ".join(f"{s}://" for s in _VALID_SCHEMES)
    return ValueError(
        f"url={url!r} has scheme {scheme!r}, which obstore_store does not handle; "
        f"valid schemes are {valid}, or a plain filesystem path"
    )


def local_dir(url: str, scheme: str | None) -> Path:
    """The filesystem directory a plain path or ``file://`` URL names."""
    if scheme is None:
        return Path(url).expanduser().absolute()
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(
            f"url={url!r} names host {parts.netloc!r}; a file:// URL must be file:///absolute/path "
            "(or file://localhost/absolute/path)"
        )
    if not parts.path:
        raise ValueError(f"url={url!r} has no path; write file:///absolute/path")
    return Path(url2pathname(unquote(parts.path)))


def _local_store(url: str, scheme: str | None, read_only: bool) -> LocalStore:
    directory = local_dir(url, scheme)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"url={url!r}: {directory} exists and is not a directory")
    if read_only and not directory.is_dir():
        raise FileNotFoundError(f"url={url!r}: no directory at {directory} (read_only=True creates nothing)")
    return LocalStore(directory, mkdir=not read_only)


# What ``obstore_store`` accepts (``validation``); which options a kind of URL can use is checked against its scheme
OBSTORE_PARAMETERS: Table = {
    "url": [Instance((str, os.PathLike), "a str or os.PathLike")],
    "read_only": [Flag()],
    "anonymous": [Flag()],
    "requester_pays": [Flag(), Instance(str, "a GCS billing project (str)")],
    "endpoint": [Instance(str, "a URL (str)"), None],
    "allow_http": [Flag(), None],
    "region": [Instance(str, "a region name (str)"), None],
    "retry": [Anything("retry_config: obstore RetryConfig keys"), None],
    "client_options": [Anything("obstore ClientConfig keys, which named options may not repeat"), None],
    "client": [Anything("resolve_client: one of CLIENTS, or None for INSITUBATCH_CLIENT")],
}


@validate_params(OBSTORE_PARAMETERS)
def obstore_store(
    url: str | os.PathLike[str],
    *,
    read_only: bool = False,
    anonymous: bool = False,
    requester_pays: bool | str = False,
    endpoint: str | None = None,
    allow_http: bool | None = None,
    region: str | None = None,
    retry: dict[str, Any] | None = None,
    client_options: dict[str, Any] | None = None,
    client: str | None = None,
    **options: Any,
) -> ForkSafeObjectStore:
    """Build a zarr ``ObjectStore`` over the obstore backend that ``url`` names, carrying how the engine reads it.

    The path after the bucket (or container, or host) becomes the obstore
    store's prefix, so zarr keys are relative to it. No request is sent here.

    Parameters
    ----------
    url
        ``s3://bucket/prefix`` (also ``s3a://``), ``gs://bucket/prefix`` (also
        ``gcs://``), ``az://container/prefix`` (also ``azure://``,
        ``abfs[s]://container@account.dfs.core.windows.net/prefix``),
        ``http(s)://host/prefix``, ``file:///abs/dir``, ``memory://`` (a new,
        empty, private store on every call), or a plain filesystem path,
        relative or absolute.
    read_only
        Refuse writes through the returned store. A local directory is created
        when this is ``False`` and must already exist when it is ``True``.
    anonymous
        Send unsigned requests (public buckets): obstore's ``skip_signature``
        for S3, GCS and Azure; nothing is signed over HTTP, on a local path or
        ``memory://``, so there it changes nothing.
    requester_pays
        Read a requester-pays bucket. S3: ``True`` (the credentials' account is
        billed). GCS: the billing project id as a string (sent as the
        ``x-goog-user-project`` header; GCS cannot bill without one).
    endpoint
        Custom service URL, e.g. ``http://127.0.0.1:9000`` for a local S3
        server. S3 and Azure ``endpoint``; GCS ``base_url``.
    allow_http
        Permit plain-HTTP connections (an HTTP client option). ``None`` means
        ``True`` when the endpoint requests go to (S3: ``AWS_ENDPOINT_URL_S3``,
        else ``endpoint``, else ``AWS_ENDPOINT_URL``), or the URL, is
        ``http://``, or ``AWS_ALLOW_HTTP`` is true, else HTTPS only.
    region
        S3 region.
    retry
        obstore ``RetryConfig`` keys: ``max_retries``, ``backoff``,
        ``retry_timeout`` (a ``timedelta``). Each key given replaces its
        default, :data:`DEFAULT_RETRY`: 10 retries, none started later than
        45 s after the first attempt. Local and memory stores take none.
    client_options
        obstore ``ClientConfig`` keys (timeouts, headers, proxies...). Each key
        given replaces its default, :data:`DEFAULT_CLIENT_OPTIONS`: a response
        silent for ``read_timeout`` 30 s is stalled, a whole request may take
        ``timeout`` 600 s, a connection ``connect_timeout`` 5 s; each of these
        failures is retried under ``retry``. A persistent failure therefore
        raises after at most ``retry_timeout`` plus one ``timeout``, never hangs.
    client
        The HTTP client that reads chunks for the loader (docs/wire.md):
        ``"auto"`` (the engine's own where it can read the store, obstore's
        otherwise), ``"engine"`` (refused here if it cannot) or ``"obstore"``.
        ``None``: the ``client`` setting (``insitubatch.config``: its
        ``set``, else ``INSITUBATCH_CLIENT``, else ``"auto"``). Metadata is always read through obstore; local and
        ``memory://`` stores use no HTTP client.
    **options
        Further obstore config keys for the cloud store, e.g.
        ``access_key_id``, ``secret_access_key``, ``account_name``.

    Returns
    -------
    ForkSafeObjectStore
        A zarr ``ObjectStore`` that carries its client setting, read policy
        and reader (``route``, ``policy``, ``reader()``); its ``close()`` (or
        leaving ``with store:``) closes the engine's connections and the store.

    Raises
    ------
    ValueError
        Unknown scheme; an option this kind of URL cannot use (e.g.
        ``requester_pays`` on HTTP, ``region`` on a local path); contradictory
        options; a config key obstore does not know; ``client="engine"`` on a
        store the engine's client cannot read (the message names the setting
        that keeps it on obstore).
    TypeError
        ``url`` is neither a string nor a path.
    FileNotFoundError
        ``read_only=True`` on a local directory that does not exist.
    """
    url = os.fspath(url)
    if not url:
        raise ValueError("url='' is empty; give a URL or a filesystem path")
    scheme, rest = split_scheme(url)
    choice, chosen_by = resolve_client(client)
    named = {
        "anonymous": anonymous,
        "requester_pays": requester_pays,
        "endpoint": endpoint,
        "allow_http": allow_http,
        "region": region,
        "retry": retry,
        "client_options": client_options,
    }
    # every named option defaults to None or False, which means "not given"
    given = {name: value for name, value in named.items() if value is not None and value is not False}
    given.update(options)

    twin_of: Callable[[], Any] | None = None  # how to build the retry-free twin of a remote store
    if scheme is None or scheme in _LOCAL_SCHEMES:
        reject_options(url, "a local", given, _UNSIGNED_ONLY)
        raw: Any = _local_store(url, scheme, read_only)
    elif scheme in _MEMORY_SCHEMES:
        reject_options(url, "a memory://", given, _UNSIGNED_ONLY)
        if rest:
            raise ValueError(
                f"url={url!r}: memory:// takes no path, because every call returns a new empty "
                "store; to share one, pass the store object itself"
            )
        raw = MemoryStore()
    elif scheme in _HTTP_SCHEMES:
        reject_options(url, "an http(s)://", given, ("anonymous", "allow_http", "retry", "client_options"))
        if allow_http is False and scheme == "http":
            raise ValueError(f"allow_http=False contradicts the plain-HTTP url={url!r}")
        http_options = merged_client_options(url, client_options, allow_http, scheme == "http")
        raw = _build(url, HTTPStore.from_url, url, client_options=http_options, retry_config=retry_config_with(retry))
        twin_of = functools.partial(
            _build, url, HTTPStore.from_url, url, client_options=http_options, retry_config=dict(NO_RETRIES)
        )
    elif scheme in _S3_SCHEMES + _GCS_SCHEMES + _AZURE_SCHEMES:
        raw, twin_of = _cloud_store(
            url,
            scheme,
            rest,
            anonymous=anonymous,
            requester_pays=requester_pays,
            endpoint=endpoint,
            allow_http=allow_http,
            region=region,
            retry=retry,
            client_options=client_options,
            options=options,
        )
    else:
        raise _unknown_scheme(url, scheme)

    if choice == "engine" and (client is not None or not isinstance(raw, (LocalStore, MemoryStore))):
        why = engine_settings(raw)
        if isinstance(why, str):
            raise ValueError(
                f"{chosen_by} for url={url!r}, but the engine's client cannot read this store: {why}; "
                "pass client='auto' or client='obstore' to read it with obstore's client"
            )
    # the engine's retry loop reads through a twin with obstore's retries off, built from the same arguments
    twin = None if twin_of is None else twin_of()
    return ForkSafeObjectStore(raw, read_only=read_only, client=(choice, chosen_by), twin=twin)


def _cloud_store(
    url: str,
    scheme: str,
    rest: str,
    *,
    anonymous: bool,
    requester_pays: bool | str,
    endpoint: str | None,
    allow_http: bool | None,
    region: str | None,
    retry: Mapping[str, Any] | None,
    client_options: Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> tuple[S3Store | GCSStore | AzureStore, Callable[[], Any]]:
    """S3, GCS or Azure store for ``url``, its options mapped to obstore's keys, and how to build its retry-free twin."""
    # obstore's URL parser knows gs:// but not its gcs:// alias
    parse_url = f"gs://{rest}" if scheme == "gcs" else url
    bucket = rest.split("/", 1)[0]
    if not bucket:
        raise ValueError(f"url={url!r} names no bucket; write {scheme}://bucket/prefix")
    if anonymous and requester_pays:
        raise ValueError(
            f"anonymous=True and requester_pays={requester_pays!r} for url={url!r}: a requester-pays "
            "bucket bills the signed-in requester, so its requests cannot be unsigned"
        )
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"endpoint={endpoint!r} must start with http:// or https://")
    if allow_http is False and endpoint is not None and endpoint.startswith("http://"):
        raise ValueError(f"allow_http=False contradicts the plain-HTTP endpoint={endpoint!r}")
    # obstore takes AWS_ENDPOINT_URL_S3 over any other S3 endpoint, the one given here included
    s3_endpoint = os.environ.get("AWS_ENDPOINT_URL_S3", "").strip() if scheme in _S3_SCHEMES else ""
    plain_http_endpoint = (
        (s3_endpoint or endpoint or "").startswith("http://")
        if s3_endpoint or endpoint
        else scheme in _S3_SCHEMES and _s3_env_allows_http()
    )
    http_options = merged_client_options(url, client_options, allow_http, plain_http_endpoint)

    config: dict[str, Any] = {}
    if anonymous:
        config["skip_signature"] = True

    if scheme in _S3_SCHEMES:
        if requester_pays is not False and requester_pays is not True:
            raise ValueError(
                f"requester_pays={requester_pays!r} for S3 url={url!r} must be True or False; "
                "S3 bills the account of the credentials"
            )
        if requester_pays:
            config["request_payer"] = True
        if endpoint is not None:
            config["endpoint"] = endpoint
        if region is not None:
            config["region"] = region
        factory: Any = S3Store.from_url
    elif scheme in _GCS_SCHEMES:
        if region is not None:
            raise ValueError(f"region={region!r} cannot be used with GCS url={url!r}; GCS has no region option")
        if requester_pays is True:
            raise ValueError(
                f"requester_pays=True for GCS url={url!r}: GCS bills a named project; pass its id, "
                "requester_pays='my-billing-project'"
            )
        if requester_pays:
            if not isinstance(requester_pays, str):
                raise ValueError(f"requester_pays={requester_pays!r} for GCS must be a project id string")
            headers = dict(http_options.get("default_headers") or {})
            headers[_GCS_USER_PROJECT_HEADER] = requester_pays
            http_options["default_headers"] = headers
        if endpoint is not None:
            config["base_url"] = endpoint
        factory = GCSStore.from_url
    else:
        if region is not None:
            raise ValueError(f"region={region!r} cannot be used with Azure url={url!r}; it has no region option")
        if requester_pays:
            raise ValueError(f"requester_pays={requester_pays!r} cannot be used with Azure url={url!r}")
        if endpoint is not None:
            config["endpoint"] = endpoint
        factory = AzureStore.from_url

    config = merge_config(url, config, options)
    built = functools.partial(_build, url, factory, parse_url, client_options=http_options or None, **config)
    return built(retry_config=retry_config_with(retry)), functools.partial(built, retry_config=dict(NO_RETRIES))


def _s3_env_allows_http() -> bool:
    """Whether ``AWS_ALLOW_HTTP`` is true, or ``AWS_ENDPOINT_URL`` (MinIO, an emulator) is plain HTTP."""
    flag, endpoint = (os.environ.get(k, "").strip().lower() for k in ("AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL"))
    return parse_flag(flag, "AWS_ALLOW_HTTP") if flag else endpoint.startswith("http://")


def _build(url: str, factory: Any, parse_url: str, **kwargs: Any) -> Any:
    """Call ``factory(parse_url, ...)``; its configuration errors become ``ValueError`` naming ``url``."""
    try:
        return factory(parse_url, **kwargs)
    except obstore.exceptions.UnknownConfigurationKeyError as exc:
        raise ValueError(f"an option for url={url!r} is not an obstore config key: {exc}") from exc
    except obstore.exceptions.BaseError as exc:
        raise ValueError(f"obstore cannot build a store for url={url!r}: {exc}") from exc


# What ``as_store`` accepts: its own check is the rule (and names the dataset's ``store`` argument)
AS_STORE_PARAMETERS: Table = {"obj": [Anything("as_store: a zarr Store, a URL string or a filesystem path")]}


@validate_params(AS_STORE_PARAMETERS)
def as_store(obj: Store | str | os.PathLike[str]) -> Store:
    """The zarr store for ``obj``: a ``Store`` as given, a URL or path opened read-only.

    Parameters
    ----------
    obj
        Any ``zarr.abc.store.Store`` (returned unchanged; the dataset adapts a
        store insitubatch did not build once, at its door, and never closes
        it; in a process forked after obstore's runtime started, zarr's plain ``ObjectStore`` comes back as a
        ``ForkSafeObjectStore`` over the same obstore store), or a URL / path string or ``os.PathLike``, opened
        with ``obstore_store(obj, read_only=True)``.

    Returns
    -------
    zarr.abc.store.Store

    Raises
    ------
    TypeError
        ``obj`` is none of the accepted types.
    """
    if type(obj) is ObjectStore and not obstore_usable():
        # a caller's own obstore store in a process forked after obstore's runtime started: read its
        # local files without obstore, or refuse any other backend at once (``stores.obstore_runtime``)
        return ForkSafeObjectStore(obj.store, read_only=obj.read_only)
    if isinstance(obj, Store):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return obstore_store(obj, read_only=True)
    raise TypeError(
        f"store={obj!r} is a {type(obj).__name__}, which cannot be made a zarr store; expected a "
        "zarr.abc.store.Store, a URL string or a filesystem path"
    )
