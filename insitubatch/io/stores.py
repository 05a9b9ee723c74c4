"""Open zarr stores from URLs through obstore, the hot path (fsspec and icechunk: ``io.store_adapters``).

Every store built here is a plain ``zarr.abc.store.Store``, so anything else
in insitubatch (and zarr itself) reads through it unchanged. Stores that this
module builds are remembered, so :func:`close_store` can close what
insitubatch opened and leave a caller's own store alone.

No function here sends a request: construction only parses options, and the
first byte moves when zarr (or the loader) reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import obstore.exceptions
from obstore.store import AzureStore, GCSStore, HTTPStore, LocalStore, MemoryStore, S3Store
from zarr.abc.store import Store
from zarr.storage import ObjectStore

from .owned import _remember

__all__ = [
    "DEFAULT_CLIENT_OPTIONS",
    "DEFAULT_RETRY",
    "as_store",
    "obstore_store",
]

# URL schemes obstore_store understands, grouped by the obstore store they build.
_LOCAL_SCHEMES = ("file",)
_MEMORY_SCHEMES = ("memory",)
_S3_SCHEMES = ("s3", "s3a")
_GCS_SCHEMES = ("gs", "gcs")
_AZURE_SCHEMES = ("az", "azure", "abfs", "abfss")
_HTTP_SCHEMES = ("http", "https")
_VALID_SCHEMES = _LOCAL_SCHEMES + _MEMORY_SCHEMES + _S3_SCHEMES + _GCS_SCHEMES + _AZURE_SCHEMES + _HTTP_SCHEMES

_UNSIGNED_ONLY = ("anonymous",)  # asks for no signature, which a local or memory:// store never sends
# The keys obstore's RetryConfig reads; obstore silently ignores any other key,
# so a typo would otherwise pass unnoticed.
_RETRY_KEYS = frozenset({"backoff", "max_retries", "retry_timeout"})

# Network defaults of every remote store obstore_store builds (HTTP, S3, GCS,
# Azure). A caller's ``retry=`` / ``client_options=`` keys override them one by
# one. obstore retries 5xx answers, dropped connections, truncated bodies and
# timeouts of reads with exponential backoff (100 ms doubling to 15 s); a client
# error such as 403 fails at once. So a persistent fault surfaces as an error
# after at most DEFAULT_RETRY_TIMEOUT plus one attempt (itself bounded by
# DEFAULT_TIMEOUT), a stalled attempt after DEFAULT_READ_TIMEOUT -- never a hang.
# A response that sends no byte for this long is stalled: the attempt fails and
# is retried. A per-read timeout, so it does not grow with the object's size.
DEFAULT_READ_TIMEOUT = "30s"
# The whole request, connect to last body byte. obstore's own default (30 s)
# fails every read of a large shard on a shared link (256 MB at the 4 MB/s one
# of 32 concurrent streams gets takes 64 s); 10 min carries a 4 GiB stored chunk
# (arrays.MAX_CHUNK_BYTES) at ~7 MB/s.
DEFAULT_TIMEOUT = "600s"
# Establishing a TCP (+TLS) connection (obstore's default).
DEFAULT_CONNECT_TIMEOUT = "5s"
# Retries of one request (obstore's default), and the time after its first
# attempt when no further retry starts: 45 s, not obstore's 3 min, so that a key
# that never answers surfaces within a minute. The loader's own reads retry in
# the engine's loop under the same two bounds (see docs/tuning.md).
DEFAULT_MAX_RETRIES = 10
DEFAULT_RETRY_TIMEOUT = timedelta(seconds=45)
DEFAULT_CLIENT_OPTIONS: Mapping[str, Any] = {
    "read_timeout": DEFAULT_READ_TIMEOUT,
    "timeout": DEFAULT_TIMEOUT,
    "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
}
DEFAULT_RETRY: Mapping[str, Any] = {"max_retries": DEFAULT_MAX_RETRIES, "retry_timeout": DEFAULT_RETRY_TIMEOUT}

# GCS bills a requester-pays read to the project named in this header; obstore
# has no config key for it (developmentseed/obstore#546), only default headers.
_GCS_USER_PROJECT_HEADER = "x-goog-user-project"


def _split_scheme(url: str) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for a URL, ``(None, url)`` for a plain path."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None, url
    return scheme.lower(), rest


def _unknown_scheme(url: str, scheme: str) -> ValueError:
    valid = ", ".join(f"{s}://" for s in _VALID_SCHEMES)
    return ValueError(
        f"url={url!r} has scheme {scheme!r}, which obstore_store does not handle; "
        f"valid schemes are {valid}, or a plain filesystem path"
    )


def _reject_options(url: str, kind: str, given: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` for any given option that this kind of URL cannot use."""
    refused = [name for name in given if name not in allowed]
    if refused:
        shown = ", ".join(f"{name}={given[name]!r}" for name in refused)
        accepts = ", ".join(allowed) if allowed else "none of them"
        raise ValueError(f"{shown} cannot be used with {kind} url={url!r}; options that apply there: {accepts}")


def _local_dir(url: str, scheme: str | None) -> Path:
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
    directory = _local_dir(url, scheme)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"url={url!r}: {directory} exists and is not a directory")
    if read_only and not directory.is_dir():
        raise FileNotFoundError(f"url={url!r}: no directory at {directory} (read_only=True creates nothing)")
    return LocalStore(directory, mkdir=not read_only)


def _client_options(
    url: str, client_options: Mapping[str, Any] | None, allow_http: bool | None, default_allow_http: bool
) -> dict[str, Any]:
    """Merge ``allow_http`` into the HTTP client options, refusing a contradiction."""
    if client_options is not None and not isinstance(client_options, Mapping):
        raise TypeError(f"client_options must be a dict, got {type(client_options).__name__}")
    options = {**DEFAULT_CLIENT_OPTIONS, **(client_options or {})}
    if allow_http is not None:
        if "allow_http" in options:
            raise ValueError(
                f"allow_http={allow_http!r} and client_options['allow_http']={options['allow_http']!r} "
                f"both given for url={url!r}; give it once"
            )
        options["allow_http"] = allow_http
    elif default_allow_http:
        options.setdefault("allow_http", True)
    return options


def _retry_config(retry: Mapping[str, Any] | None) -> dict[str, Any]:
    """``DEFAULT_RETRY`` with the caller's ``retry`` keys on top."""
    if retry is None:
        return dict(DEFAULT_RETRY)
    if not isinstance(retry, Mapping):
        raise TypeError(f"retry must be a dict of obstore RetryConfig keys, got {type(retry).__name__}")
    unknown = sorted(set(retry) - _RETRY_KEYS)
    if unknown:
        raise ValueError(f"retry has unknown keys {unknown}; valid keys are {sorted(_RETRY_KEYS)}")
    return {**DEFAULT_RETRY, **retry}


def _merge_config(url: str, config: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Add the free-form ``**options`` to the config the named options built."""
    for key, value in options.items():
        if key in config:
            raise ValueError(
                f"option {key}={value!r} for url={url!r} repeats what a named option already set "
                f"({key}={config[key]!r}); give it once"
            )
        config[key] = value
    return config


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
    **options: Any,
) -> ObjectStore[Any]:
    """Build a zarr ``ObjectStore`` over the obstore backend that ``url`` names.

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
        ``True`` when ``endpoint``, the URL or (S3) ``AWS_ENDPOINT_URL`` is
        ``http://`` or ``AWS_ALLOW_HTTP`` is true, else HTTPS only.
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
    **options
        Further obstore config keys for the cloud store, e.g.
        ``access_key_id``, ``secret_access_key``, ``account_name``.

    Returns
    -------
    zarr.storage.ObjectStore
        Remembered as opened by insitubatch, so :func:`close_store` closes it.

    Raises
    ------
    ValueError
        Unknown scheme; an option this kind of URL cannot use (e.g.
        ``requester_pays`` on HTTP, ``region`` on a local path); contradictory
        options; a config key obstore does not know.
    TypeError
        ``url`` is neither a string nor a path.
    FileNotFoundError
        ``read_only=True`` on a local directory that does not exist.
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or os.PathLike, got {type(url).__name__}")
    if not url:
        raise ValueError("url='' is empty; give a URL or a filesystem path")
    scheme, rest = _split_scheme(url)
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

    if scheme is None or scheme in _LOCAL_SCHEMES:
        _reject_options(url, "a local", given, _UNSIGNED_ONLY)
        raw: Any = _local_store(url, scheme, read_only)
    elif scheme in _MEMORY_SCHEMES:
        _reject_options(url, "a memory://", given, _UNSIGNED_ONLY)
        if rest:
            raise ValueError(
                f"url={url!r}: memory:// takes no path, because every call returns a new empty "
                "store; to share one, pass the store object itself"
            )
        raw = MemoryStore()
    elif scheme in _HTTP_SCHEMES:
        _reject_options(url, "an http(s)://", given, ("anonymous", "allow_http", "retry", "client_options"))
        if allow_http is False and scheme == "http":
            raise ValueError(f"allow_http=False contradicts the plain-HTTP url={url!r}")
        raw = _build(
            url,
            HTTPStore.from_url,
            url,
            client_options=_client_options(url, client_options, allow_http, scheme == "http"),
            retry_config=_retry_config(retry),
        )
    elif scheme in _S3_SCHEMES + _GCS_SCHEMES + _AZURE_SCHEMES:
        raw = _cloud_store(
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

    store = ObjectStore(raw, read_only=read_only)
    _remember(store)
    return store


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
) -> S3Store | GCSStore | AzureStore:
    """S3, GCS or Azure store for ``url``, its options mapped to obstore's keys."""
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
    plain_http_endpoint = (
        endpoint.startswith("http://") if endpoint else scheme in _S3_SCHEMES and _s3_env_allows_http()
    )
    http_options = _client_options(url, client_options, allow_http, plain_http_endpoint)

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

    config = _merge_config(url, config, options)
    return _build(
        url,
        factory,
        parse_url,
        client_options=http_options or None,
        retry_config=_retry_config(retry),
        **config,
    )


def _s3_env_allows_http() -> bool:
    """Whether ``AWS_ALLOW_HTTP`` is true, or ``AWS_ENDPOINT_URL`` (MinIO, an emulator) is plain HTTP."""
    flag, endpoint = (os.environ.get(k, "").strip().lower() for k in ("AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL"))
    return flag in ("1", "true", "yes", "on") if flag else endpoint.startswith("http://")


def _build(url: str, factory: Any, parse_url: str, **kwargs: Any) -> Any:
    """Call ``factory(parse_url, ...)``; its configuration errors become ``ValueError`` naming ``url``."""
    try:
        return factory(parse_url, **kwargs)
    except obstore.exceptions.UnknownConfigurationKeyError as exc:
        raise ValueError(f"an option for url={url!r} is not an obstore config key: {exc}") from exc
    except obstore.exceptions.BaseError as exc:
        raise ValueError(f"obstore cannot build a store for url={url!r}: {exc}") from exc


def as_store(obj: Store | str | os.PathLike[str]) -> Store:
    """The zarr store for ``obj``: a ``Store`` as given, a URL or path opened read-only.

    Parameters
    ----------
    obj
        Any ``zarr.abc.store.Store`` (returned unchanged, and never closed by
        :func:`close_store`), or a URL / path string or ``os.PathLike``, opened
        with ``obstore_store(obj, read_only=True)``.

    Returns
    -------
    zarr.abc.store.Store

    Raises
    ------
    TypeError
        ``obj`` is none of the accepted types.
    """
    if isinstance(obj, Store):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return obstore_store(obj, read_only=True)
    raise TypeError(
        f"store={obj!r} is a {type(obj).__name__}, which cannot be made a zarr store; expected a "
        "zarr.abc.store.Store, a URL string or a filesystem path"
    )
