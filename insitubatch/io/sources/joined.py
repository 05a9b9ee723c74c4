"""``join_stores``: variables from several stores (or groups) as one dataset, aligned on their time coordinate.

A :class:`JoinedStore` is a read-only zarr store whose root holds each
member store as a group of that name (``"pl/t"`` is array ``t`` of member
``pl``), so every array keeps its own chunks, codecs, coordinates and cache
identity, and each member reads its bytes with its own client and
credentials. Labels are the array names themselves (``"t"``); a name held by
two members is refused (choose with ``variables=`` or rename with ``rename=``).

The anchors are the dates of the member with the coarsest time step (the
*anchor member*): a finer member whose step divides it is subsampled to its
dates. Each other member's variable reads, for anchor ``i``, the row of its
own array that holds anchor ``i``'s time (plus the view's offset): a
:class:`~insitubatch.io.time_offsets.TimeRows` table looked up once,
vectorised, as offsets in time on an axis with gaps are. An anchor whose time
a member lacks is dropped in training like a missing date; the dates in every
member are the join's common dates, and ``report`` says how many steps of
each member were left out, naming the first.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.abc.store import Store

from ...errors import TimeAxisError
from ...stores.obstore_stores import as_store
from ...stores.owned import close_store
from ...validation import INT_KNOB_MAX, Anything, Instance, Interval, Table, validate_params
from ..geometry import ArrayGeometry
from ..group import open_geometries, open_statics, scan_group
from ..statics import StaticField
from ..time_offsets import NAMED_TIMES, StepAxis, TimeRows, format_duration
from .routed import Route, RoutedStore, close_with, member_keys

__all__ = ["JoinedStore", "MemberTimes", "join_stores"]

# the root group a joined store answers itself: each member is a group under it
_ROOT_V3 = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


@dataclass(frozen=True)
class MemberTimes:
    """One member's time axis in a join: its steps, and those the join left out (not among the common dates)."""

    store: str
    steps: int
    step: str
    used: int
    left_out: int
    first_left_out: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ticks(axis: StepAxis, origin: Any) -> np.ndarray:
    """The axis's stored instants as ns on one scale shared by every member (``origin``: a cftime reference)."""
    ticks = axis.ticks
    if axis.axis.is_cftime:  # cftime ticks count from the axis's own first date
        first = next(v for v in axis.values if v is not None)
        ticks = ticks + (first - origin) // _dt.timedelta(microseconds=1) * 1000
    return ticks


class JoinedStore(RoutedStore):
    """Several stores as groups of one read-only store, with the variables' labels and the anchor dates.

    Made by :func:`join_stores`; pass it to ``InSituDataset`` like any store.
    """

    def __init__(self, members: Mapping[str, Store], labels: Mapping[str, str], groups: Mapping[str, str]) -> None:
        super().__init__(members)
        self.groups = dict(groups)  # by member: the group of its store it is ("" for the root)
        self.labels = dict(labels)  # label -> array path ("member/array") of variables and statics alike
        self.geometries: dict[str, ArrayGeometry] = {}  # by label: each variable's own view, unaligned
        self.static_fields: dict[str, StaticField] = {}  # by label
        self.axes: dict[str, StepAxis] = {}  # by member with time-axis variables: its time axis
        self.anchor: str | None = None
        self.common = np.zeros(0, "datetime64[ns]")  # the dates every member stores, as the anchors' axis decodes them
        self._common_ticks = np.zeros(0, np.int64)
        self.report: dict[str, MemberTimes] = {}
        self._ticks: dict[str, np.ndarray] = {}

    def place(
        self, geometries: Mapping[str, ArrayGeometry], statics: Mapping[str, StaticField], axes: Mapping[str, StepAxis]
    ) -> None:
        """Take the variables and statics opened through this store, and its members' time axes: set the anchors.

        Raises
        ------
        TimeAxisError
            Steps that do not divide the coarsest, or no common date.
        """
        self.geometries, self.static_fields, self.axes = dict(geometries), dict(statics), dict(axes)
        # the anchor member: the coarsest step (the first given among equals)
        self.anchor = max(self.axes, key=lambda m: self.axes[m].step) if self.axes else None
        origin = next((a.values[a.stored][0] for a in self.axes.values() if a.axis.is_cftime), None)
        self._ticks = {m: _ticks(a, origin) for m, a in self.axes.items()}
        self._common_ticks = self._common_dates()
        if self.anchor is not None:
            anchor = self.axes[self.anchor]
            self.common = anchor.values[np.isin(self._ticks[self.anchor], self._common_ticks) & anchor.stored]
        self.report = self._report()

    # -- routing -----------------------------------------------------------------
    def route(self, key: str) -> Route:
        if key == "zarr.json":
            return _ROOT_V3
        name, _, inner = key.partition("/")
        store = self.members.get(name)
        if store is None or not inner:
            return None
        return name, store, self._inner(name, inner)

    def _inner(self, name: str, key: str) -> str:
        """Member ``name``'s own key for its ``key`` (under its group)."""
        group = self.groups.get(name, "")
        return f"{group}/{key}".strip("/") if group else key

    async def _member_keys(self, prefix: str) -> list[str]:
        keys = ["zarr.json"] if "zarr.json".startswith(prefix) else []
        for name, store in self.members.items():
            if prefix.startswith(f"{name}/"):
                rest = prefix[len(name) + 1 :]
            elif f"{name}/".startswith(prefix):
                rest = ""
            else:
                continue
            group = self.groups.get(name, "")
            found = await member_keys(store, self._inner(name, rest))
            keys += [f"{name}/{k[len(group) + 1 :] if group else k}" for k in found]
        return keys

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.strip("/")
        if not prefix:
            for child in ("zarr.json", *self.members):
                yield child
            return
        name, _, inner = prefix.partition("/")
        store = self.members.get(name)
        if store is not None:
            async for child in store.list_dir(self._inner(name, inner)):
                yield child

    def member_of(self, path: str) -> str:
        """The member whose array ``path`` is (``"pl/t"`` is ``pl``'s)."""
        name = path.split("/", 1)[0]
        if name not in self.members or "/" not in path:
            raise ValueError(
                f"array {path!r} is in no member of this joined store; its arrays are "
                f"'<member>/<array>' with member one of {sorted(self.members)}"
            )
        return name

    # -- the common dates ----------------------------------------------------------
    def _common_dates(self) -> np.ndarray:
        """The anchor member's stored instants that every member stores (ns); raises when there are none."""
        if self.anchor is None:
            return np.zeros(0, np.int64)
        anchor = self.axes[self.anchor]
        for name, axis in self.axes.items():
            if axis.step == 0 or anchor.step % axis.step:
                raise TimeAxisError(
                    f"joined stores step at {self._steps_text()}: store {name!r}'s step "
                    f"{format_duration(axis.step)} does not divide store {self.anchor!r}'s "
                    f"{format_duration(anchor.step)}, so no frequency is common to both; join stores whose "
                    "steps divide each other (a 6-hourly with a 12-hourly), or subsample one first"
                )
        common = self._ticks[self.anchor][anchor.stored]
        for name in self.axes:
            ticks = self._ticks[name][self.axes[name].stored]
            common = common[np.isin(common, ticks)]
        if not len(common):
            raise TimeAxisError(
                "joined stores share no date: "
                + "; ".join(f"store {m!r} spans {self._span(m)}" for m in self.axes)
                + "; join stores whose time coordinates overlap, at steps that meet"
            )
        return common

    def _steps_text(self) -> str:
        return ", ".join(f"{m!r} {format_duration(a.step)}" for m, a in self.axes.items())

    def _span(self, name: str) -> str:
        axis = self.axes[name]
        kept = axis.ticks[axis.stored]
        if not len(kept):
            return "no date"
        return f"{axis.format(kept[0])} to {axis.format(kept[-1])} every {format_duration(axis.step)}"

    def _report(self) -> dict[str, MemberTimes]:
        out = {}
        for name, axis in self.axes.items():
            stored = np.flatnonzero(axis.stored)
            dropped = stored[~np.isin(self._ticks[name][stored], self._common_ticks)]
            first = tuple(axis.exact(int(axis.ticks[i])) for i in dropped[:NAMED_TIMES])
            out[name] = MemberTimes(
                name, len(stored), format_duration(axis.step), len(stored) - len(dropped), len(dropped), first
            )
        return out

    # -- the variables on the anchor axis -------------------------------------------
    def align(self, label: str, g: ArrayGeometry) -> ArrayGeometry:
        """``g`` read on the anchor dates: a variable of another member reads the row holding each anchor's time.

        Raises
        ------
        TypeError
            A step-count offset on a member whose time axis has gaps (give it as a duration).
        """
        member = self.member_of(g.path)
        if member == self.anchor or self.anchor is None:
            return g
        own = g.step_axis(f"joined variable {label!r}")
        if g.time_rows is not None:
            offsets, windowed = g.time_rows.offsets, g.time_rows.windowed
        else:
            if (g.offset or any(g.window_steps)) and not own.regular:
                raise TypeError(
                    f"joined variable {label!r} (array {g.path!r}) has offsets in steps on a time axis with gaps "
                    f"(first: {own.gap_text()}); give them as durations ('6h') to pair by time"
                )
            offsets = tuple(s * own.step for s in g.read_offsets)
            windowed = bool(g.window_steps)
        anchor = self.axes[self.anchor]
        rows = _rows_at(self._ticks[member], own.stored, self._ticks[self.anchor], anchor.stored, offsets)
        shift, steps = (0, offsets) if windowed else (offsets[0], (0,))
        kept = self._ticks[member][own.stored]
        span = (int(kept[0]), int(kept[-1])) if len(kept) else None
        table = TimeRows(anchor, shift, steps, windowed, rows, read_axis=own, read_span=span)
        nominal, nominal_steps = table.nominal
        return dataclasses.replace(g, offset=nominal, window_steps=nominal_steps if windowed else (), time_rows=table)

    def resolve(
        self, variables: Mapping[str, ArrayGeometry] | Sequence[str] | None, n_samples: int
    ) -> dict[str, ArrayGeometry]:
        """``InSituDataset``'s ``variables`` of this store as ``{label: geometry}`` on the anchor dates.

        ``None`` is every joined variable; a list names labels (or ``"<member>/<array>"`` paths);
        a mapping gives views (``joined.geometries[label].shift("6h")``). The anchor member's come first.

        Raises
        ------
        ValueError
            An unknown label, or a manifest whose samples are not the anchor member's time steps.
        """
        if variables is None:
            chosen = dict(self.geometries)
        elif isinstance(variables, Mapping):
            chosen = {str(lb): g for lb, g in variables.items()}
            bad = {lb: type(g).__name__ for lb, g in chosen.items() if not isinstance(g, ArrayGeometry)}
            if bad:
                raise TypeError(f"variables must map labels to ArrayGeometry (joined.geometries[...]), got {bad}")
        elif isinstance(variables, (list, tuple)):
            unknown = [v for v in variables if v not in self.geometries and v not in self.labels.values()]
            if unknown:
                raise ValueError(
                    f"variables {unknown} are not joined; the joined variables are {sorted(self.geometries)}"
                )
            by_path = {p: lb for lb, p in self.labels.items()}
            picked = [str(by_path.get(v, v)) for v in variables]
            chosen = {lb: self.geometries[lb] for lb in picked}
        else:
            raise TypeError(f"variables must be a mapping, a list of labels or None, got {type(variables).__name__}")
        if not chosen:
            raise ValueError("variables is empty: name at least one joined variable")
        if n_samples != self.anchor_steps:
            raise ValueError(
                f"the manifest has {n_samples} samples, but a joined dataset's anchors are store {self.anchor!r}'s "
                f"{self.anchor_steps} time steps (its step, {self.report[str(self.anchor)].step}, is the coarsest); "
                f"make the manifest from one of its variables, e.g. split_by_time(joined.geometries[label], ...)"
            )
        first = sorted(chosen, key=lambda lb: self.member_of(chosen[lb].path) != self.anchor)
        return {lb: self.align(lb, chosen[lb]) for lb in first}

    def resolve_statics(self, statics: Mapping[str, StaticField] | Sequence[str] | None) -> dict[str, StaticField]:
        """``InSituDataset``'s ``statics`` of this store: labels (a list) or ``{label: StaticField}``."""
        if statics is None or isinstance(statics, Mapping):
            return dict(statics or {})
        unknown = [s for s in statics if s not in self.static_fields]
        if unknown:
            raise ValueError(f"statics {unknown} are not joined; the joined statics are {sorted(self.static_fields)}")
        return {s: self.static_fields[s] for s in statics}

    def member_of_read(self, path: str, chunk: int) -> str:
        """The member that serves sample-axis chunk ``chunk`` of array ``path``: the one it is in."""
        return self.member_of(path)

    @property
    def anchor_steps(self) -> int:
        """Anchors along the join's sample axis: the anchor member's time steps (what a manifest must hold)."""
        return 0 if self.anchor is None else len(self.axes[self.anchor].ticks)


def _rows_at(
    own: np.ndarray, own_stored: np.ndarray, anchors: np.ndarray, anchor_stored: np.ndarray, offsets: Sequence[int]
) -> np.ndarray:
    """``(len(anchors), len(offsets))``: the index of ``own`` holding ``anchors[i] + offsets[s]``, or ``-1``."""
    where = np.flatnonzero(own_stored)
    kept = own[where]
    out = np.full((len(anchors), len(offsets)), -1, dtype=np.int64)
    if not len(kept):
        return out
    for j, off in enumerate(offsets):
        wanted = anchors + off
        k = np.clip(np.searchsorted(kept, wanted), 0, len(kept) - 1)
        hit = anchor_stored & (kept[k] == wanted)
        out[hit, j] = where[k[hit]]
    return out


def _group_of(name: str, given: Any) -> str:
    """The group a ``(store, group)`` member names (``""``: a store given alone is its root)."""
    if not isinstance(given, tuple):
        return ""
    if len(given) != 2 or not isinstance(given[1], str):
        raise TypeError(f"store {name!r} must be a store, a URL, or a (store, group) pair; got {given!r}")
    return given[1].strip("/")


# What ``join_stores`` accepts (``validation``); the members and their arrays are checked against the stores
JOIN_PARAMETERS: Table = {
    "stores": [Anything("join_stores: a non-empty {name: store, URL or (store, group)} mapping")],
    "variables": [None, Instance(Mapping, "a {member: [array, ...]} mapping")],
    "rename": [None, Instance(Mapping, 'a {"<member>/<array>": label} mapping')],
    "dim": [Instance(str, "a str (the time dimension's name)")],
    "sample_axis": [Interval(-INT_KNOB_MAX)],  # negative counts from the end, as open_geometries takes it
}


@validate_params(JOIN_PARAMETERS)
def join_stores(
    stores: Mapping[str, Any],
    *,
    variables: Mapping[str, Sequence[str]] | None = None,
    rename: Mapping[str, str] | None = None,
    dim: str = "time",
    sample_axis: int = 0,
) -> JoinedStore:
    """Variables of several stores (or groups) as one store, aligned on their time coordinate.

    Parameters
    ----------
    stores
        ``{name: store}``: each a zarr ``Store`` or a URL/path (opened read-only),
        read with its own client and credentials, or a ``(store, group)`` pair
        for a group of one (its coordinates in that group).
    variables
        ``{name: [array, ...]}``: the arrays each member contributes (data
        variables and statics alike); a member left out contributes all of them.
    rename
        ``{"<member>/<array>": label}``: a label for an array whose name another member also uses.
    dim
        The time dimension: arrays with it are variables, the others statics.
    sample_axis
        Where ``scan_group`` looks for each member's sample dimension when listing it.

    Returns
    -------
    JoinedStore
        A read-only store; ``InSituDataset(joined, manifest, variables=[labels])``
        reads it, with the manifest made from a variable of the anchor member
        (``joined.anchor``; ``joined.geometries`` holds every variable's).

    Raises
    ------
    ValueError
        No store, an unknown member or array in ``variables``/``rename``, or one
        label held by two members (naming both, and how to choose or rename).
    TypeError
        A member that is neither a store, a URL nor a ``(store, group)`` pair.
    TimeAxisError
        Members whose time steps do not divide one another (naming each
        store's step), or no date common to every member (naming their spans).
    """
    if not isinstance(stores, Mapping) or not stores:
        raise ValueError(f"stores must be a non-empty mapping of name to store, got {stores!r}")
    bad = [name for name in stores if not isinstance(name, str) or not name or "/" in name]
    if bad:
        raise ValueError(f"store names must be non-empty strings without '/', got {bad}")
    chosen = dict(variables or {})
    unknown = sorted(set(chosen) - set(stores))
    if unknown:
        raise ValueError(f"variables names stores {unknown} that are not joined; the stores are {sorted(stores)}")
    given = {name: s[0] if isinstance(s, tuple) else s for name, s in stores.items()}
    groups = {name: _group_of(name, s) for name, s in stores.items()}
    members: dict[str, Store] = {}
    try:
        for name, s in given.items():
            members[name] = as_store(s)
        return _joined(members, given, groups, chosen, dict(rename or {}), dim, sample_axis)
    except BaseException:
        for name, member in members.items():  # what was opened here for a join that failed
            if not isinstance(given[name], Store):
                close_store(member)
        raise


def _joined(
    members: dict[str, Store],
    given: Mapping[str, Any],
    groups: Mapping[str, str],
    chosen: Mapping[str, Sequence[str]],
    renames: dict[str, str],
    dim: str,
    sample_axis: int,
) -> JoinedStore:
    """``join_stores`` once its members are open."""
    labels: dict[str, str] = {}
    axes_of: dict[str, int] = {}  # by variable label: where its time dimension is
    first_timed: dict[str, str] = {}  # by member with variables: the label of its first
    for name, store in members.items():
        group = groups[name]
        if name in chosen:  # named arrays open without listing the store (an HTTP endpoint cannot list)
            wanted = [str(p) for p in chosen[name]]
        else:
            contents = scan_group(store, sample_axis=sample_axis, group=group)
            wanted = sorted(p[len(group) + 1 :] if group else p for p in {**contents.variables, **contents.statics})
        try:
            opened = open_geometries(store, variables=wanted, group=group)
        except ValueError as exc:
            raise ValueError(f"store {name!r}: {exc}") from exc
        dims = {p[len(group) + 1 :] if group else p: g.dimension_names or () for p, g in opened.items()}
        for path in wanted:
            label = renames.pop(f"{name}/{path}", path)
            if label in labels:
                other = labels[label].split("/", 1)[0]
                raise ValueError(
                    f"variable {label!r} is in store {other!r} and in store {name!r}; choose one with "
                    f"variables={{{other!r}: [...], {name!r}: [...]}} or rename one with "
                    f"rename={{'{name}/{path}': '{label}_{name}'}}"
                )
            labels[label] = f"{name}/{path}"
            if dim in dims[path]:
                axes_of[label] = dims[path].index(dim)
                first_timed.setdefault(name, label)
    if renames:
        raise ValueError(f"rename names arrays no joined store holds: {sorted(renames)}")
    if not first_timed:
        raise ValueError(f"no joined store holds an array along {dim!r}; name the time dimension with dim=")
    joined = JoinedStore(members, labels, groups)
    close_with(joined, given)  # close_store(joined) closes what it opened
    # each geometry and static opened through the joined store: its path names its member, its coordinates too
    paths = {lb: p for lb, p in labels.items() if lb in axes_of}
    opened = open_geometries(joined, variables=list(paths.values()))
    geometries = {lb: opened[p].with_sample_axis(axes_of[lb]) for lb, p in paths.items()}
    static_paths = {lb: p for lb, p in labels.items() if lb not in axes_of}
    opened_statics = open_statics(joined, variables=list(static_paths.values())) if static_paths else {}
    statics = {lb: opened_statics[p] for lb, p in static_paths.items()}
    joined.place(
        geometries, statics, {m: geometries[lb].step_axis(f"joining store {m!r}") for m, lb in first_timed.items()}
    )
    return joined
