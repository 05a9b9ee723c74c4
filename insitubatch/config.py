"""insitubatch's settings: every ``INSITUBATCH_*`` variable, its default, and one rule for reading its words.

A setting is looked up where it is used, in this order:

1. a value given to :func:`set` (inside its ``with`` block, or until the
   process ends when it is called without one);
2. the setting's environment variable, read at that moment, so a variable
   exported (or monkeypatched) after ``import insitubatch`` takes effect;
3. the default in :data:`SETTINGS`.

Like ``zarr.config``, the values given to :func:`set` live in a donfig
``Config`` (:data:`config`); unlike zarr's, it reads no environment or YAML
file when it is built, because insitubatch has always read its variables at
use time and callers rely on that.

Yes/no variables follow obstore's rule for its own (``AWS_ALLOW_HTTP``):
case-insensitive ``1``/``true``/``on``/``yes``/``y`` and ``0``/``false``/
``off``/``no``/``n``; any other word is refused with an error naming the
variable. Two more families of variables are not settings and are not here:
the slot-task variables a scheduler hands a write task
(``insitubatch.write.slots``), and the build switches ``setup.py`` reads
(:data:`BUILD_VARIABLES`, with the same yes/no words). docs/tuning.md lists
them all in one table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from donfig import Config

from .errors import SettingError

__all__ = [
    "BUILD_VARIABLES",
    "CLIENTS",
    "FALSE_WORDS",
    "SETTINGS",
    "TRUE_WORDS",
    "Setting",
    "config",
    "get",
    "lookup",
    "parse_flag",
    "set",
]

# The words of a yes/no variable: obstore's (object_store's ``Parse for bool``), so that ours and
# ``AWS_ALLOW_HTTP`` read one way.
TRUE_WORDS = ("1", "true", "on", "yes", "y")
FALSE_WORDS = ("0", "false", "off", "no", "n")

# Which HTTP client reads a store (docs/wire.md): the choices of ``client=`` and of INSITUBATCH_CLIENT.
CLIENTS = ("auto", "engine", "obstore")

# Variables ``setup.py`` reads when it builds the kernels (it cannot import the package, so it keeps its own
# copy of the yes/no words; tests/test_config.py checks the copy), with what each turns on.
BUILD_VARIABLES: Mapping[str, str] = {
    "INSITUBATCH_DEBUG_KERNELS": "build the kernels with bounds and wraparound checks, at -O0 -g",
    "INSITUBATCH_OPENMP": "build with OpenMP, so the gather copies a batch's runs on several threads",
}


class _Refused(ValueError):
    """A parser's refusal: ``str(exc)`` says what would be valid."""


def parse_flag(value: Any, name: str = "value") -> bool:
    """``value`` read as yes/no: a bool, or one of :data:`TRUE_WORDS` / :data:`FALSE_WORDS` in any case.

    Raises
    ------
    SettingError
        Any other value; the message names ``name`` and the words accepted.
    """
    try:
        return _flag(value)
    except _Refused as exc:
        raise SettingError(f"{name}={value!r} must be {exc}") from None


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise _Refused(f"one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)} (any case)")


def _client(value: Any) -> str:
    word = str(value).strip().lower()
    if word not in CLIENTS:
        raise _Refused(f"one of {', '.join(CLIENTS)}")
    return word


def _positive_bytes(value: Any) -> int:
    if isinstance(value, bool):
        raise _Refused("a positive integer number of bytes")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or (not isinstance(value, str) and number != value):
        raise _Refused("a positive integer number of bytes")
    return number


@dataclass(frozen=True)
class Setting:
    """One setting: its key for :func:`set`, its environment variable, its default and how a value is read."""

    key: str
    variable: str
    default: Any
    parse: Callable[[Any], Any]
    summary: str


_ALL = (
    Setting(
        "client",
        "INSITUBATCH_CLIENT",
        "auto",
        _client,
        "which HTTP client reads a store built without client= (docs/wire.md)",
    ),
    # Largest decoded chunk the engine will allocate, in bytes. A stored chunk (the shard of a sharded array:
    # what one decode returns) and a sample-axis chunk across its tiles (what one pool entry holds) must each
    # fit. Real archives keep chunks near 1-100 MB and shards within a few GB; metadata past this is corrupt or
    # hostile, and believing it would allocate that much. ``max_chunk_bytes=`` raises it per call.
    Setting(
        "max_chunk_bytes",
        "INSITUBATCH_MAX_CHUNK_BYTES",
        4 * 2**30,
        _positive_bytes,
        "largest decoded chunk, in bytes, an array may declare before it is refused as corrupt",
    ),
    Setting(
        "no_buffer_reuse",
        "INSITUBATCH_NO_BUFFER_REUSE",
        False,
        _flag,
        "every batch a fresh array instead of a reused buffer (for debugging a kept batch)",
    ),
    Setting(
        "traceback",
        "INSITUBATCH_TRACEBACK",
        False,
        _flag,
        "the command line prints a failure's whole traceback, not its first line",
    ),
)
# Every setting, by key.
SETTINGS: Mapping[str, Setting] = {s.key: s for s in _ALL}

# What :func:`set` gave, and nothing else (no defaults, no environment: those are read at use time).
config = Config("insitubatch", defaults=[], paths=[], env={})
_UNSET = object()


def _setting(key: str) -> Setting:
    try:
        return SETTINGS[key]
    except KeyError:
        raise SettingError(f"{key!r} is not an insitubatch setting; settings: {', '.join(SETTINGS)}") from None


def lookup(key: str) -> tuple[Any, str]:
    """``(value, what set it)`` for setting ``key``: :func:`set`, else its variable, else the default.

    What set it reads ``"the default"``, ``"INSITUBATCH_CLIENT=obstore"`` or
    ``"insitubatch.config.set(client='obstore')"``.

    Raises
    ------
    SettingError
        ``key`` is no setting, or its variable holds a value it does not accept.
    """
    setting = _setting(key)
    given = config.get(key, _UNSET)
    if given is not _UNSET:  # checked by set()
        return given, f"insitubatch.config.set({key}={given!r})"
    text = os.environ.get(setting.variable, "")
    if not text.strip():
        return setting.default, "the default"
    try:
        value = setting.parse(text)
    except _Refused as exc:
        raise SettingError(f"{setting.variable}={text!r} must be {exc} (from the environment)") from None
    return value, f"{setting.variable}={text.strip()}"


def get(key: str) -> Any:
    """The value of setting ``key`` now: given to :func:`set`, else its environment variable, else its default.

    Raises
    ------
    SettingError
        ``key`` is no setting, or its variable holds a value it does not accept.
    """
    return lookup(key)[0]


def set(values: Mapping[str, Any] | None = None, **settings: Any) -> Any:
    """Give settings a value that wins over their environment variables; a context manager.

    ``with insitubatch.config.set(client="obstore"): ...`` holds inside the
    block and restores what was before on leaving it; called without
    ``with``, the values hold for the rest of the process. Process-wide:
    threads see the same values.

    Parameters
    ----------
    values
        ``{key: value}``, for keys that are not identifiers.
    **settings
        ``key=value`` for any key of :data:`SETTINGS`.

    Returns
    -------
    donfig.config_obj.ConfigSet
        The context manager that undoes the change.

    Raises
    ------
    SettingError
        A key is no setting, or a value is not one it accepts.
    """
    given = {**(values or {}), **settings}
    parsed = {}
    for key, value in given.items():
        setting = _setting(key)
        try:
            parsed[key] = setting.parse(value)
        except _Refused as exc:
            raise SettingError(f"{key}={value!r} must be {exc} (given to insitubatch.config.set)") from None
    return config.set(parsed)
