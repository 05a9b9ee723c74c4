"""Parameter checks at the public door: one table of constraints per entry point, one validator applying it.

Each public entry point declares ``{parameter: [constraint, ...]}`` beside its
signature (in the spirit of scikit-learn's ``_parameter_constraints``) and is
wrapped by :func:`validate_params`, which checks every argument against its
table before the body runs and hands the body the normalised values (a
``np.int64`` count arrives as ``int``, a list of transforms as a tuple). An
argument is valid when one of its constraints accepts it: ``None``, a
:class:`Interval` of ints, a :class:`Options` set, a :class:`Flag`, an
:class:`Instance` of some types, :class:`Callables`, :class:`IsCallable`, or
:class:`Anything` (a value the body resolves with its own domain's checks:
a store URL, the variables against the store, a device string).

The messages name the parameter, the value and what is valid:
``batch_size=0 must be >= 1`` (a value of the right kind out of range:
``ValueError``), ``shuffle must be True or False, got str ('false')`` (no
constraint of its kind: ``TypeError``). Rules between parameters
(``persist`` needs a ``cache_dir``) stay small named checks beside the table.
What is inside the door trusts what the door let in.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "INT_KNOB_MAX",
    "Anything",
    "Callables",
    "Constraint",
    "Flag",
    "Instance",
    "Interval",
    "IsCallable",
    "Options",
    "Table",
    "check_param",
    "check_params",
    "positive_int",
    "validate_params",
]

# Counts, sizes and seeds end up in int64 arrays (plans, ledgers, byte offsets): a larger one is a mistake
# that would otherwise surface far away as numpy's overflow, not naming the knob.
INT_KNOB_MAX = int(np.iinfo(np.int64).max)

F = TypeVar("F", bound=Callable[..., Any])


class Constraint(ABC):
    """One kind of valid value: whether a value is of its kind, and whether it is valid within it.

    The validator asks each of a parameter's constraints in turn; the first
    whose kind the value has decides (``check`` raises or returns the value
    normalised). A value of no constraint's kind is a ``TypeError`` listing
    every constraint's ``description``.
    """

    description = "valid"  # what its kind is, for a type error: "an int"

    @abstractmethod
    def is_kind(self, value: Any) -> bool:
        """Whether ``value`` is of this constraint's kind (an int, a word, a path), valid or not."""

    def check(self, name: str, value: Any) -> Any:
        """``value`` normalised; raises ``ValueError``/``TypeError`` naming ``name`` when it is invalid."""
        return value

    def hint(self, name: str, value: Any) -> str:
        """A suggestion appended to the type error, or ``""``."""
        return ""

    def valid(self) -> str:
        """What is valid within its kind, beside the other constraints: ``"a positive int"``."""
        return self.description


class Interval(Constraint):
    """An int (not a bool) in ``[low, high]``; returned as a plain ``int``."""

    description = "an int"

    def __init__(self, low: int = 1, high: int = INT_KNOB_MAX) -> None:
        self.low, self.high = low, high

    def is_kind(self, value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))

    def check(self, name: str, value: Any) -> int:
        if value < self.low:
            raise ValueError(f"{name}={value} must be >= {self.low}")
        if value > self.high:
            raise ValueError(f"{name}={value} must be <= {self.high}")
        return int(value)

    def valid(self) -> str:
        return {0: "a non-negative int", 1: "a positive int"}.get(self.low, f"an int >= {self.low}")

    def __repr__(self) -> str:
        return f"Interval({self.low}, {self.high})"


class Options(Constraint):
    """One of a fixed set of values (words, in practice): a wrong word is a ``ValueError`` listing what is valid."""

    def __init__(self, *values: Any) -> None:
        self.values = tuple(values)
        self.description = f"one of {self.values}"

    def is_kind(self, value: Any) -> bool:
        return isinstance(value, tuple({type(v) for v in self.values}))

    def valid(self) -> str:
        return f'"{self.values[0]}"' if len(self.values) == 1 else self.description

    def __repr__(self) -> str:
        return f"Options{self.values}"


class Flag(Constraint):
    """``True`` or ``False`` (numpy's too), returned as a ``bool``; ``bool("false")`` is True, so no string passes."""

    description = "True or False"

    def is_kind(self, value: Any) -> bool:
        return isinstance(value, (bool, np.bool_))

    def check(self, name: str, value: Any) -> bool:
        return bool(value)

    def __repr__(self) -> str:
        return "Flag()"


class Instance(Constraint):
    """An instance of ``types``; ``description`` says what that is to a user (``"a SplitManifest (from ...)"``)."""

    def __init__(self, types: type | tuple[type, ...], description: str) -> None:
        self.types = types
        self.description = description

    def is_kind(self, value: Any) -> bool:
        return isinstance(value, self.types)

    def __repr__(self) -> str:
        return f"Instance({self.types!r})"


class IsCallable(Constraint):
    """Any callable (a function, a class, an object with ``__call__``)."""

    description = "callable"

    def is_kind(self, value: Any) -> bool:
        return callable(value)

    def __repr__(self) -> str:
        return "IsCallable()"


class Callables(Constraint):
    """A sequence of callables, returned as a tuple; one bare callable is a mistake worth naming."""

    description = "a list of callables"

    def is_kind(self, value: Any) -> bool:
        return isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and not callable(value)

    def check(self, name: str, value: Any) -> tuple:
        for i, item in enumerate(value):
            if not callable(item):
                raise TypeError(f"{name}[{i}] must be callable, got {type(item).__name__} ({item!r})")
        return tuple(value)

    def hint(self, name: str, value: Any) -> str:
        return f"; wrap a single transform in a list: {name}=[t]" if callable(value) else ""

    def __repr__(self) -> str:
        return "Callables()"


class Anything(Constraint):
    """Any value here: the entry point resolves it with its own domain's checks, named by ``checked_by``."""

    def __init__(self, checked_by: str) -> None:
        self.checked_by = checked_by
        self.description = f"anything ({checked_by})"

    def is_kind(self, value: Any) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Anything({self.checked_by!r})"


Constraints = Sequence[Constraint | None]
Table = Mapping[str, Constraints]  # an entry point's parameters, each with the constraints one of which it meets


def check_param(name: str, value: Any, constraints: Constraints) -> Any:
    """``value`` normalised by the first of ``constraints`` whose kind it has; raises naming ``name`` otherwise.

    ``None`` in ``constraints`` admits ``None`` as it is. A word that is not
    one of the :class:`Options` is a ``ValueError`` naming every valid form
    (``max_inflight='fast' must be "auto" or a positive int``). A value of
    no constraint's kind is a ``TypeError`` naming the kinds that are not
    words (``max_inflight must be an int, got float (1.0)``); ``None`` is
    the documented default wherever it is allowed, so it is not repeated.
    """
    kinds = [c for c in constraints if c is not None]
    for constraint in constraints:
        if constraint is None:
            if value is None:
                return None
        elif constraint.is_kind(value):
            if isinstance(constraint, Options) and value not in constraint.values:
                raise ValueError(f"{name}={value!r} must be {' or '.join(c.valid() for c in kinds)}")
            return constraint.check(name, value)
    named = [c for c in kinds if not isinstance(c, Options)] or kinds
    valid = " or ".join(c.description for c in named) or "None"
    hints = "".join(c.hint(name, value) for c in kinds)
    raise TypeError(f"{name} must be {valid}, got {type(value).__name__} ({value!r}){hints}")


def check_params(table: Table, values: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry of ``values`` checked against its row of ``table``, in the table's order; the normalised dict."""
    checked = dict(values)
    for name, constraints in table.items():
        if name in values:
            checked[name] = check_param(name, values[name], constraints)
    return checked


def positive_int(name: str, value: Any, minimum: int = 1, maximum: int = INT_KNOB_MAX) -> int:
    """``value`` as an int in ``[minimum, maximum]``: the one-parameter form, for a method's lone knob."""
    return check_param(name, value, (Interval(minimum, maximum),))


def validate_params(table: Table) -> Callable[[F], F]:
    """Check a public entry point's arguments against ``table`` before its body runs.

    ``table`` must name exactly the function's parameters (``self``,
    ``*args`` and ``**kwargs`` aside): a parameter without a constraint is
    refused when the module is imported. The body receives the normalised
    values. The table is kept on the wrapper as ``parameter_constraints``.
    """

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        names = [
            p.name
            for p in signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ("self", "cls")
        ]
        if set(names) != set(table):
            missing, extra = sorted(set(names) - set(table)), sorted(set(table) - set(names))
            raise TypeError(f"{func.__qualname__}'s constraints table lacks {missing} and names unknown {extra}")

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            for name, constraints in table.items():
                arguments[name] = check_param(name, arguments[name], constraints)
            return func(*bound.args, **bound.kwargs)

        checked.parameter_constraints = table  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return decorate
