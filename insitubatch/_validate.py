"""Argument checks shared by the public constructors: one message style everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Counts, sizes and seeds end up in int64 arrays (plans, ledgers, byte offsets): a larger one is a mistake
# that would otherwise surface far away as numpy's overflow, not naming the knob.
INT_KNOB_MAX = np.iinfo(np.int64).max


def positive_int(name: str, value: Any, minimum: int = 1, maximum: int = INT_KNOB_MAX) -> int:
    """``value`` as an int in ``[minimum, maximum]``; the error names ``name`` and the valid range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    if value > maximum:
        raise ValueError(f"{name}={value} must be <= {maximum}")
    return int(value)


def positive_int_or_auto(name: str, value: Any) -> Any:
    """``"auto"`` as given, else a positive int (the message names both forms)."""
    if value == "auto" and isinstance(value, str):
        return "auto"
    if isinstance(value, str):
        raise ValueError(f'{name}={value!r} must be "auto" or a positive int')
    return positive_int(name, value)


def flag(name: str, value: Any) -> bool:
    # bool("false") is True: a string or a number here is a mistake, not a flag
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")
    return bool(value)


def callables(name: str, value: Any) -> tuple:
    """A sequence of callables as a tuple; one bare callable is a mistake worth naming."""
    if callable(value) or isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a list of callables, got {type(value).__name__} ({value!r}); "
            f"wrap a single transform in a list: {name}=[t]"
        )
    for i, t in enumerate(value):
        if not callable(t):
            raise TypeError(f"{name}[{i}] must be callable, got {type(t).__name__} ({t!r})")
    return tuple(value)
