"""The validator at the public door: each constraint kind, and one table per entry point naming its whole signature."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import insitubatch
from insitubatch.adapters.jax import JaxView, to_jax
from insitubatch.adapters.torch import TorchView, as_torch
from insitubatch.validation import (
    INT_KNOB_MAX,
    Anything,
    Callables,
    Flag,
    Instance,
    Interval,
    IsCallable,
    Options,
    check_param,
    check_params,
    validate_params,
)
from insitubatch.write import SlotWriter

# --- each constraint kind ------------------------------------------------------------


@pytest.mark.parametrize(
    "constraints, value, expected",
    [
        ([Interval(1)], 3, 3),
        ([Interval(1)], np.int64(7), 7),
        ([Interval(0)], 0, 0),
        ([Interval(1)], INT_KNOB_MAX, INT_KNOB_MAX),
        ([Interval(-INT_KNOB_MAX)], -2, -2),
        ([Options("raise", "nan")], "nan", "nan"),
        ([Options("auto"), Interval(1)], "auto", "auto"),
        ([Options("auto"), Interval(1)], 4, 4),
        ([Flag()], True, True),
        ([Flag()], np.bool_(False), False),
        ([Interval(1), None], None, None),
        ([Instance((str, os.PathLike), "a path")], "x", "x"),
        ([IsCallable()], len, len),
        ([Callables()], [abs, len], (abs, len)),
        ([Callables()], (), ()),
        ([Anything("checked later")], object, object),
    ],
)
def test_a_valid_value_comes_back_normalised(constraints, value, expected) -> None:
    got = check_param("knob", value, constraints)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "constraints, value, exc, message",
    [
        ([Interval(1)], 0, ValueError, "knob=0 must be >= 1"),
        ([Interval(0)], -1, ValueError, "knob=-1 must be >= 0"),
        ([Interval(1, 8)], 9, ValueError, "knob=9 must be <= 8"),
        ([Interval(1)], 2**64, ValueError, f"knob={2**64} must be <= {INT_KNOB_MAX}"),
        ([Interval(1)], 2.5, TypeError, "knob must be an int, got float (2.5)"),
        ([Interval(1)], True, TypeError, "knob must be an int, got bool (True)"),
        ([Interval(1), None], "8", TypeError, "knob must be an int, got str ('8')"),
        ([Options("raise", "nan")], "skip", ValueError, "knob='skip' must be one of ('raise', 'nan')"),
        ([Options("raise", "nan")], 5, TypeError, "knob must be one of ('raise', 'nan'), got int (5)"),
        ([Options("auto"), Interval(1)], "fast", ValueError, "knob='fast' must be \"auto\" or a positive int"),
        ([Options("auto"), Interval(0)], "fast", ValueError, "knob='fast' must be \"auto\" or a non-negative int"),
        ([Options("auto"), Interval(1)], 1.0, TypeError, "knob must be an int, got float (1.0)"),
        ([Options("auto"), Interval(1)], 0, ValueError, "knob=0 must be >= 1"),
        ([Flag()], "false", TypeError, "knob must be True or False, got str ('false')"),
        ([Flag()], 1, TypeError, "knob must be True or False, got int (1)"),
        ([Flag(), None], 0, TypeError, "knob must be True or False, got int (0)"),
        ([Instance(Path, "a Path")], "p", TypeError, "knob must be a Path, got str ('p')"),
        ([IsCallable(), None], 3, TypeError, "knob must be callable, got int (3)"),
        ([Callables()], [abs, 5], TypeError, "knob[1] must be callable, got int (5)"),
        ([Callables()], "scale", TypeError, "knob must be a list of callables, got str ('scale')"),
        ([None], 0, TypeError, "knob must be None, got int (0)"),
    ],
)
def test_an_invalid_value_is_refused_naming_parameter_value_and_what_is_valid(constraints, value, exc, message) -> None:
    with pytest.raises(exc) as info:
        check_param("knob", value, constraints)
    assert str(info.value) == message


def test_a_bare_callable_where_a_list_is_wanted_says_how_to_wrap_it() -> None:
    with pytest.raises(TypeError, match=r"knob must be a list of callables, got function .*; wrap a single"):
        check_param("knob", lambda c: c, [Callables()])


def test_the_first_constraint_of_the_value_s_kind_decides() -> None:
    # a bool is not an int here, so Flag decides before Interval could
    assert check_param("knob", True, [Interval(0), Flag()]) is True
    assert check_param("knob", 3, [Interval(0), Flag()]) == 3


def test_check_params_checks_in_table_order_and_leaves_other_entries() -> None:
    table = {"a": [Interval(1)], "b": [Flag()]}
    assert check_params(table, {"a": np.int32(2), "b": np.bool_(True), "c": "x"}) == {"a": 2, "b": True, "c": "x"}
    with pytest.raises(ValueError, match="a=0 must be >= 1"):  # "a" is checked first
        check_params(table, {"b": "no", "a": 0})


# --- the decorator --------------------------------------------------------------------


def test_validate_params_hands_the_body_normalised_values() -> None:
    seen: dict[str, Any] = {}

    @validate_params({"n": [Interval(1)], "flags": [Callables()], "mode": [Options("a", "b")]})
    def door(n: int, *, flags=(), mode="a", **extra: Any) -> None:
        seen.update(n=n, flags=flags, mode=mode, extra=extra)

    door(np.int64(3), flags=[abs], other=1)
    assert seen == {"n": 3, "flags": (abs,), "mode": "a", "extra": {"other": 1}} and type(seen["n"]) is int
    with pytest.raises(ValueError, match="mode='c' must be one of"):
        door(1, mode="c")
    assert door.parameter_constraints["n"][0].low == 1  # type: ignore[attr-defined]
    assert list(inspect.signature(door).parameters) == ["n", "flags", "mode", "extra"]


def test_a_table_that_misses_or_invents_a_parameter_is_refused_when_the_door_is_built() -> None:
    with pytest.raises(TypeError, match=r"lacks \['b'\] and names unknown \['c'\]"):

        @validate_params({"a": [Flag()], "c": [Flag()]})
        def door(a: bool, b: bool) -> None:
            pass


# --- one table per public entry point --------------------------------------------------

# Every public callable of ``insitubatch.__all__`` (and the writer's) either checks its arguments at the door
# through a table, makes a view whose constructor does, or is exempt below, with the reason.
DELEGATES: dict[Callable[..., Any], type] = {as_torch: TorchView, to_jax: JaxView}
EXEMPT = {
    # value objects: frozen records the library builds and hands out (their fields are its own)
    "ArrayGeometry": "a geometry from open_geometries",
    "Batch": "a batch from a pass",
    "DateRun": "a record of split_by_time",
    "DecodedChunk": "what a chunk transform receives",
    "FillSteps": "the result of scan_fill_steps",
    "PassStats": "a pass's counters",
    "SplitDates": "a record of split_by_time",
    "SplitManifest": "the result of split_by_chunk / split_by_time",
    "StaticField": "a field from open_statics",
    "DatasetView": "made by InSituDataset.split, over its checked context",
}


def _door(obj: Any) -> Callable[..., Any]:
    return obj.__init__ if inspect.isclass(obj) else obj


def _parameters(func: Callable[..., Any]) -> set[str]:
    return {
        p.name
        for p in inspect.signature(func).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ("self", "cls")
    }


def _public_doors() -> dict[str, Any]:
    doors = {name: getattr(insitubatch, name) for name in insitubatch.__all__}
    doors = {n: o for n, o in doors.items() if not (inspect.isclass(o) and issubclass(o, BaseException))}
    return {**doors, "SlotWriter": SlotWriter}


TABLED = sorted(n for n, o in _public_doors().items() if n not in EXEMPT and o not in DELEGATES)


@pytest.mark.parametrize("name", TABLED)
def test_each_entry_point_s_table_names_exactly_its_parameters(name: str) -> None:
    door = _door(_public_doors()[name])
    table = getattr(door, "parameter_constraints", None)
    assert table is not None, f"{name} checks no table of parameter constraints (validation.validate_params)"
    assert set(table) == _parameters(door)
    for param, constraints in table.items():
        assert constraints, f"{name}'s {param} has no constraint"
        assert all(c is None or hasattr(c, "is_kind") for c in constraints), (name, param, constraints)


@pytest.mark.parametrize("factory", list(DELEGATES), ids=lambda f: f.__name__)
def test_a_factory_passes_everything_to_a_checked_constructor(factory) -> None:
    made = DELEGATES[factory]
    assert set(made.__init__.parameter_constraints) == _parameters(factory)


def test_a_new_parameter_without_a_constraint_fails() -> None:
    # what the import of a door's module would do if its signature grew a parameter its table lacks
    door = insitubatch.InSituDataset.__init__
    table = dict(door.parameter_constraints)
    table.pop("hedge")
    with pytest.raises(TypeError, match=r"InSituDataset.__init__'s constraints table lacks \['hedge'\]"):
        validate_params(table)(door.__wrapped__)


def test_the_dataset_table_holds_the_cache_options_rows() -> None:
    from insitubatch.cache import CACHE_PARAMETERS

    table = insitubatch.InSituDataset.__init__.parameter_constraints
    assert all(table[name] is rows for name, rows in CACHE_PARAMETERS.items())


METHODS = [
    insitubatch.InSituDataset.set_epoch,
    insitubatch.InSituDataset.infer,
    insitubatch.InSituDataset.describe,
    insitubatch.InSituDataset.print_summary,
    insitubatch.DatasetView.set_epoch,
    insitubatch.DatasetView.iterate,
]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.__qualname__)
def test_the_knobs_of_a_dataset_s_methods_are_tabled_too(method) -> None:
    assert set(method.parameter_constraints) == _parameters(method)
