"""Per-array chunk-transform fingerprints: the identity stamped on every persisted cache entry.

A cached chunk is the *output* of its array's chunk-transform pipeline, so an
entry is only valid for the pipeline that made it. ``array_fingerprints``
hashes each array's ordered pipeline to 16 hex digits; each transform is identified by,
in order of preference:

1. ``transform.cache_key`` (a ``str``) when set — authoritative, nothing else
   about the transform is looked at;
2. its value as cloudpickle sees it (the ``cache`` extra): closure cells,
   referenced globals and instance attributes, arrays included, plus the
   bytecode of the transform's own function or methods (so an edited body of
   an importable function or class counts even though cloudpickle pickles
   those by reference);
3. its source text (``inspect.getsource``) plus the ``repr`` of its instance
   config — blind to closure variables, referenced globals and arrays numpy
   summarises in ``repr``. This fallback warns once per process.

``Scoped`` wrappers (``applies``) contribute their inner transform: the scope
decides *which* arrays' pipelines a transform joins, not its identity.

The *source* has an identity too where a store can name the version of the
bytes it reads: :func:`source_identity` gives an icechunk session's snapshot
(``icechunk-<snapshot id>``), and a persisted cache keeps each snapshot's
chunks apart (``cache.options``), so a new snapshot never revives another's
chunks while each snapshot still revives its own. A plain zarr store has
no version to name: its cache is one directory per dataset, as before.

Hashes are stable across processes: sets are hashed in a sorted order and
classes defined in ``__main__`` (which cloudpickle tags with a random
per-process id) are hashed by their definition. A by-value function's
bytecode includes its line numbers, so moving it counts as a change — a
``cache_key`` pins identity when that is unwanted.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
import sys
import threading
import types
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zarr.abc.store import Store

from ..io.sources.routed import RoutedStore
from ..stores.icechunk_stores import snapshot_of
from ..transforms import ChunkTransform, Scoped, pipeline_for

__all__ = [
    "FINGERPRINT_FORMAT",
    "FINGERPRINT_HEX_LEN",
    "array_fingerprints",
    "is_fingerprint",
    "source_identity",
]

# Bump when the way a transform is identified changes: every persisted entry then goes stale.
FINGERPRINT_FORMAT = 1
# 8 bytes = 16 hex digits: ample for telling a handful of pipeline versions apart.
_DIGEST_BYTES = 8
FINGERPRINT_HEX_LEN = 2 * _DIGEST_BYTES
# Fixed so the hash does not move with Python's default pickle protocol.
_PICKLE_PROTOCOL = 5
# Inner digests (set elements, class bodies) use a longer hash; only the final one is short.
_INNER_DIGEST_BYTES = 16
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FINGERPRINT = re.compile(rf"^[0-9a-f]{{{FINGERPRINT_HEX_LEN}}}$")
# Class attributes that are interpreter machinery, not part of what a class does.
_CLASS_DICT_SKIP = frozenset({"__dict__", "__weakref__", "__module__", "_abc_impl", "__slotnames__"})

_source_fallback_warned = False
_warn_lock = threading.Lock()


def is_fingerprint(value: object) -> bool:
    """True for a well-formed fingerprint: a ``str`` of 16 lowercase hex digits."""
    return isinstance(value, str) and _FINGERPRINT.match(value) is not None


def array_fingerprints(transforms: Sequence[ChunkTransform], paths: Iterable[str]) -> dict[str, str]:
    """``{path: the 16-hex fingerprint of pipeline_for(transforms, path)}`` for each array path.

    Each transform is identified once, however many arrays' pipelines it joins;
    ``Scoped`` wrappers are unwrapped, and the empty pipeline has a fixed
    fingerprint.

    Raises
    ------
    TypeError
        When a transform's ``cache_key`` is set but is not a ``str``.

    Warns
    -----
    UserWarning
        Once per process, the first time a transform is identified by its
        source text (no ``cache_key``, and cloudpickle is missing or cannot
        pickle it).
    """
    transforms = tuple(transforms)
    identities: dict[int, tuple[str, bytes]] = {}
    for t in transforms:
        identities[id(t)] = _transform_identity(t)
    return {p: _combine(identities[id(t)] for t in pipeline_for(transforms, p)) for p in paths}


def source_identity(store: Store) -> str | None:
    """The version of the bytes ``store`` reads, as a file name, or ``None`` when the store names none.

    An icechunk session at a snapshot reads ``icechunk-<snapshot id>`` (the
    same bytes for ever); any other store has no version to name.

    Raises
    ------
    ValueError
        ``store`` is a writable icechunk session with uncommitted changes,
        which reads no snapshot's bytes.
    """
    if isinstance(store, RoutedStore):  # a store of several (join_stores, concat_stores): its members' versions
        versions = {name: source_identity(member) for name, member in store.members.items()}
        if not any(versions.values()):
            return None
        digest = hashlib.blake2b(repr(sorted(versions.items())).encode(), digest_size=_DIGEST_BYTES).hexdigest()
        return f"stores-{digest}"
    snapshot = snapshot_of(store)
    return None if snapshot is None else f"icechunk-{snapshot}"


def _combine(identities: Iterable[tuple[str, bytes]]) -> str:
    """The 16-hex digest of a pipeline's transform identities, in order, under the format version."""
    h = hashlib.blake2b(digest_size=_DIGEST_BYTES, person=b"insitu-pipeline")
    _update(h, f"format={FINGERPRINT_FORMAT}".encode())
    for kind, identity in identities:
        _update(h, kind.encode())
        _update(h, identity)
    return h.hexdigest()


def _update(h: Any, data: bytes) -> None:
    """Length-prefix ``data`` so concatenated fields can never alias each other."""
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def _unwrap(t: object) -> object:
    while isinstance(t, Scoped):
        t = t.transform
    return t


def _name(t: object) -> str:
    return getattr(t, "__qualname__", None) or type(t).__qualname__


def _transform_identity(t: object) -> tuple[str, bytes]:
    """``(kind, identity bytes)`` of one transform; kind is ``key``, ``pickle`` or ``source``."""
    inner = _unwrap(t)
    key = getattr(inner, "cache_key", None)
    if key is not None:
        if not isinstance(key, str):
            raise TypeError(
                f"cache_key of chunk transform {_name(inner)} must be a str or None, got {type(key).__name__}"
            )
        return "key", key.encode()
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return "pickle", _pickle_digest(cloudpickle, inner, {}) + _code_identity(inner)
        except Exception:  # an unpicklable transform (a lock, an open file…) still gets the source hash
            pass
    _warn_source_fallback(inner)
    return "source", _source_identity(inner)


def _warn_source_fallback(inner: object) -> None:
    global _source_fallback_warned
    with _warn_lock:
        if _source_fallback_warned:
            return
        _source_fallback_warned = True
    warnings.warn(
        f"chunk transform {_name(inner)} is fingerprinted from its source text because cloudpickle "
        "is not installed or cannot pickle it. A source hash cannot see closures, referenced globals "
        "or large arrays (numpy summarises them in repr), so changing those will not mark the "
        "persistent cache stale. Install insitubatch[cache] or give the transform a cache_key. "
        "(warned once per process)",
        UserWarning,
        stacklevel=4,
    )


# ---------------------------------------------------------------------------
# cloudpickle identity


class _HashSink:
    """A write-only file that hashes what the pickler writes (no pickle is kept in memory)."""

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=_INNER_DIGEST_BYTES, person=b"insitu-pickle")

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


def _pickle_digest(cloudpickle: types.ModuleType, obj: object, classes: dict[type, object]) -> bytes:
    """Hash ``obj`` as cloudpickle pickles it, with the two per-process variations removed.

    ``classes`` memoises the identities of by-value classes across nested calls
    (``None`` marks one in progress, which a self-reference then names).
    """

    base: Any = cloudpickle.Pickler  # a class from a module passed in, so untyped here

    class Pickler(base):
        def persistent_id(self, o: object) -> object:
            kind = type(o)
            if isinstance(o, (set, frozenset)) and (kind is set or kind is frozenset):
                # iteration order of a set of str depends on the per-process hash seed
                members = sorted(_pickle_digest(cloudpickle, e, classes) for e in o)
                return ("insitubatch.set", kind.__name__, tuple(members))
            if isinstance(o, type) and not _importable(o):
                # cloudpickle tags a by-value class with a random per-process tracker id
                return _class_identity(cloudpickle, o, classes)
            return None

    sink = _HashSink()
    Pickler(sink, protocol=_PICKLE_PROTOCOL).dump(obj)
    return sink.hash.digest()


def _class_identity(cloudpickle: types.ModuleType, cls: type, classes: dict[type, object]) -> object:
    if cls in classes:
        known = classes[cls]
        return ("insitubatch.class-ref", cls.__module__, cls.__qualname__) if known is None else known
    classes[cls] = None
    slots = getattr(cls, "__slots__", ())
    slots = (slots,) if isinstance(slots, str) else tuple(slots)
    body = sorted(
        (name, value)
        for name, value in vars(cls).items()
        if name not in _CLASS_DICT_SKIP and name not in slots and not isinstance(value, types.MemberDescriptorType)
    )
    state = (cls.__module__, cls.__qualname__, cls.__bases__, type(cls), body)
    identity = ("insitubatch.class", cls.__module__, cls.__qualname__, _pickle_digest(cloudpickle, state, classes))
    classes[cls] = identity
    return identity


def _importable(obj: Any) -> bool:
    """True when pickle can name ``obj`` as ``module.qualname`` (so it is not pickled by value)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return False
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is obj


# ---------------------------------------------------------------------------
# bytecode identity (joins the cloudpickle hash)


def _functions_of(obj: object) -> list[types.FunctionType]:
    """The Python functions whose code *is* ``obj``: itself, its method's, or its class's methods."""
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(obj, types.MethodType):
        return _functions_of(obj.__func__)
    if isinstance(obj, functools.partial):
        return _functions_of(obj.func)
    out: list[types.FunctionType] = []
    for cls in type(obj).__mro__:
        if cls.__module__ == "builtins":
            continue
        for _, value in sorted(vars(cls).items()):
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                out.extend(f for f in (value.fget, value.fset, value.fdel) if isinstance(f, types.FunctionType))
            elif isinstance(value, types.FunctionType):
                out.append(value)
    return out


def _code_identity(obj: object) -> bytes:
    h = hashlib.blake2b(digest_size=_INNER_DIGEST_BYTES, person=b"insitu-code")
    for f in _functions_of(obj):
        _update(h, f.__qualname__.encode())
        _hash_code(h, f.__code__)
    return h.digest()


def _hash_code(h: Any, code: types.CodeType) -> None:
    """What a code object does, without where it sits (file name and line numbers are left out)."""
    _update(h, code.co_code)
    _update(
        h,
        repr(
            (
                code.co_names,
                code.co_varnames,
                code.co_freevars,
                code.co_cellvars,
                code.co_argcount,
                code.co_kwonlyargcount,
                code.co_flags,
            )
        ).encode(),
    )
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _hash_code(h, const)
        else:
            _update(h, _stable_repr(const).encode())


def _stable_repr(value: object) -> str:
    """``repr`` in a per-process-stable form: sets sorted, memory addresses removed."""
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(_stable_repr(v) for v in value)!r})"
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + "(" + ",".join(_stable_repr(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_stable_repr(k)}:{_stable_repr(v)}" for k, v in value.items()) + "}"
    return _ADDRESS.sub("", repr(value))


# ---------------------------------------------------------------------------
# source identity (the fallback)


def _source_of(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):  # built in, or defined where no source is kept (a REPL, -c)
        code = getattr(obj, "__code__", None)
        if code is not None:
            h = hashlib.blake2b(digest_size=_INNER_DIGEST_BYTES)
            _hash_code(h, code)
            return f"<code {h.hexdigest()}>"
        return f"<{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}>"


def _config_repr(obj: object) -> str:
    """The instance's configuration as text, with memory addresses removed (they vary per run)."""
    state = vars(obj) if hasattr(obj, "__dict__") else None
    return _stable_repr(dict(sorted(state.items()))) if isinstance(state, Mapping) else _stable_repr(obj)


def _source_identity(obj: object) -> bytes:
    if isinstance(obj, functools.partial):
        parts = [_source_of(obj.func), _stable_repr((obj.args, dict(sorted(obj.keywords.items()))))]
    elif isinstance(obj, types.MethodType):
        parts = [_source_of(obj.__func__), _config_repr(obj.__self__)]
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
        parts = [_source_of(obj)]
    else:
        parts = [_source_of(type(obj)), _config_repr(obj)]
    return "\0".join(parts).encode()
