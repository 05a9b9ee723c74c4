"""``--isel`` / ``--sel`` on the command line: ``DIM=VALUE`` as the selection ``ArrayGeometry.isel``/``sel`` take.

``VALUE`` is one label or position (the axis is dropped), ``A,B,...`` a list
(kept in that order) or ``START:STOP[:STEP]`` a slice, either end left empty
for open. Items read as ints, then floats, else stay text (dates, names), so
``--sel level=500,850``, ``--sel latitude=60:30``, ``--sel time=2020-01-01:``
and ``--isel latitude=::-1`` all mean what they would in Python.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from ..io.labelled import Labelled

__all__ = ["parse_selection", "select"]


def _item(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _value(text: str) -> Any:
    if ":" in text:
        parts = text.split(":")
        if len(parts) > 3:
            raise ValueError(f"{text!r} has more than START:STOP:STEP")
        return slice(*(None if p == "" else _item(p) for p in parts))
    if "," in text:
        return [_item(p) for p in text.split(",") if p != ""]
    return _item(text)


def parse_selection(items: Sequence[str] | None, option: str) -> dict[str, Any]:
    """``["level=500,850", "latitude=60:30"]`` as ``{"level": [500, 850], "latitude": slice(60, 30)}``."""
    out: dict[str, Any] = {}
    for item in items or ():
        dim, sep, text = item.partition("=")
        if not sep or not dim or not text:
            raise argparse.ArgumentTypeError(f"{option} {item!r}: expected DIM=VALUE, e.g. {option} level=500,850")
        try:
            out[dim] = _value(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{option} {item!r}: {exc}") from None
    return out


def select(
    arrays: Mapping[str, Labelled], isel: Mapping[str, Any] | None, sel: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Each array with the selections applied on the dimensions it has, as xarray's ``Dataset.isel``/``sel`` do.

    Raises ``ValueError`` for a dimension none of ``arrays`` has, naming
    the dimensions they do have.
    """
    wanted = {**(isel or {}), **(sel or {})}
    have = {d for a in arrays.values() for d in (a.dims or ()) if d is not None}
    unknown = sorted(set(wanted) - have)
    if unknown:
        raise ValueError(f"no array has dimension(s) {unknown}; the dimensions are {sorted(have)}")
    out: dict[str, Any] = {}
    for label, a in arrays.items():
        dims = set(a.dims or ())
        mine_i = {d: v for d, v in (isel or {}).items() if d in dims}
        mine_s = {d: v for d, v in (sel or {}).items() if d in dims}
        if mine_i:
            a = a.isel(mine_i)
        out[label] = a.sel(mine_s) if mine_s else a
    return out
