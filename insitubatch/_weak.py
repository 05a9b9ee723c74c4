"""A set that holds its members weakly, whose members' deaths run no Python code.

``weakref.WeakSet`` drops a dead member in a Python callback. A Ctrl-C whose
KeyboardInterrupt is raised while that callback runs can only be printed and
dropped (the script goes on as if the key was never pressed), and a member
that dies with every batch or pass makes that likely. Here each member's weak
reference removes itself through ``set.discard``, a C method.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["WeakMembers"]

T = TypeVar("T")


class WeakMembers(Generic[T]):
    """``add``, ``discard``, ``in``, ``len`` and iteration, as ``weakref.WeakSet`` has them (members hashable)."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: set[weakref.ref[T]] = set()

    def add(self, member: T) -> None:
        self._refs.add(weakref.ref(member, self._refs.discard))

    def discard(self, member: T) -> None:
        self._refs.discard(weakref.ref(member))  # equal to the stored reference while the member lives

    def __contains__(self, member: object) -> bool:
        try:
            return weakref.ref(member) in self._refs
        except TypeError:  # not weakly referenceable, so never added
            return False

    def __len__(self) -> int:
        return len(self._refs)

    def __iter__(self) -> Iterator[T]:
        for ref in self._refs.copy():  # a member may die while the caller iterates
            member = ref()
            if member is not None:
                yield member
