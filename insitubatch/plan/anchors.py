"""Which anchors a pass may draw by their times: every time stored, no declared missing date, on the frequency.

Three rules join the window-fits-the-array rule (``epoch.valid_anchor_range``)
and the quarantine, each a boolean per anchor of the anchor grid, computed
once with numpy from the sample axis's time coordinate:

- an offset in time (``shift("6h")``, ``window(["-6h", "0h"])``) on an axis
  with gaps wants a time that is not stored: the anchor is *unstored*;
- a label's window (or the anchor itself) touches a date the manifest
  declares ``missing``: the anchor is *missing*;
- the manifest's ``frequency`` keeps anchors whose time is a whole number of
  it after the first date: the others are *off frequency*;
- a label reads a row that no store holds (the padding ``concat_stores`` puts
  between stores, declared by the arrays' ``UNSTORED_ROWS`` attribute): the
  anchor is *unstored* too, and inference skips it (it has no date to infer).

Training and evaluation drop such anchors; inference raises for the first
two (naming the times) and samples the frequency. :func:`split_losses` is
the accounting ``describe()`` and ``SplitManifest.describe(variables)``
print: per split, how many anchors each rule took and the first times named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CalendarError, TimeAxisError
from ..io.dates import format_bound
from ..io.geometry import ArrayGeometry
from ..io.time_offsets import NAMED_TIMES, StepAxis, exact_text, format_duration, parse_duration, unstored_rows

__all__ = [
    "AnchorRules",
    "SplitLoss",
    "anchor_rules",
    "declare_frequency",
    "declare_missing",
    "declare_times",
    "loss_note",
    "missing_samples",
    "on_frequency",
    "rows_kept",
    "split_losses",
    "times_lines",
    "valid_anchor_range",
    "with_declared_times",
]


def valid_anchor_range(manifest: Any, variables: Mapping[str, ArrayGeometry]) -> tuple[int, int]:
    """Anchors ``[lo, hi)`` for which every label's ``anchor + offset`` (every window step) lies inside its array.

    ``manifest`` is the ``SplitManifest`` whose grid the anchors are on. A label offset in time on an
    irregular axis (``time_rows``) reaches by time: its anchors whose times stay within the stored span.
    """
    n = manifest.n_samples
    offsets = [off for g in variables.values() if g.time_rows is None for off in g.read_offsets] or [0]
    lo = max(0, -min(offsets))
    hi = min(n, n - max(offsets))
    for g in variables.values():
        if g.time_rows is not None:
            lo, hi = max(lo, g.time_rows.reach[0]), min(hi, g.time_rows.reach[1])
    return lo, max(lo, hi)


def declare_missing(axis: StepAxis, missing: Iterable[Any] | None, what: str) -> tuple[tuple[str, str], ...]:
    """``missing`` (dates, or ``(start, end)`` pairs, both inclusive) as the manifest records them: text pairs.

    A string names its whole resolution (``"1979-02-03"`` is that day's every
    step), a ``datetime``/``datetime64`` one instant.

    Raises
    ------
    TypeError
        ``missing`` is not an iterable of dates and pairs.
    ValueError
        A date that is not one of the axis's calendar, or a pair whose start is after its end.
    """
    if missing is None:
        return ()
    if isinstance(missing, str | bytes) or not isinstance(missing, Iterable):
        raise TypeError(
            f"{what}: missing must be a list of dates or (start, end) pairs, got {type(missing).__name__}; "
            "write missing=['1979-02-03'] for one date"
        )
    out = []
    for item in missing:
        pair = (item, item) if isinstance(item, str) or not isinstance(item, tuple | list) else tuple(item)
        if len(pair) != 2:
            raise TypeError(f"{what}: missing holds {item!r}: each item is a date or a (start, end) pair")
        try:
            texts = [p.strip() if isinstance(p, str) else exact_text(axis.axis, axis.axis.instant(p)) for p in pair]
            lo, hi = axis.axis.bounds(texts[0])[0], axis.axis.bounds(texts[1])[1]
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{what}: missing holds {item!r}: {exc}") from exc
        if lo > hi:
            raise ValueError(
                f"{what}: missing range {format_bound(pair[0])} .. {format_bound(pair[1])} ends before it starts"
            )
        out.append((texts[0], texts[1]))
    return tuple(out)


def missing_samples(axis: StepAxis, declared: Iterable[tuple[str, str]]) -> np.ndarray:
    """``(n,)``: which samples' times lie in a declared missing date or range."""
    values = axis.axis.values(axis.values)
    out = np.zeros(len(values), dtype=bool)
    for start, end in declared:
        lo, hi = axis.axis.bounds(start)[0], axis.axis.bounds(end)[1]
        if axis.axis.is_cftime:
            out |= np.array([v is not None and lo <= v <= hi for v in values], dtype=bool)
        else:
            out |= (values >= lo) & (values <= hi)
    return out


def declare_frequency(axis: StepAxis, frequency: Any, what: str) -> str | None:
    """``frequency`` as the manifest records it (``"12h"``), checked against the axis's step.

    Raises
    ------
    TimeAxisError
        A frequency that is not a positive whole multiple of the axis's step (the message names both).
    """
    if frequency is None:
        return None
    ns = parse_duration(frequency, f"{what}: frequency")
    if ns <= 0 or not axis.step or ns % axis.step:
        raise TimeAxisError(
            f"{what}: frequency={frequency!r} is not a whole multiple of the archive's "
            f"{format_duration(axis.step) if axis.step else 'unknown'} step: anchors every "
            f"{format_duration(abs(ns)) if ns else '0'} would fall between stored times; give a multiple "
            f"({format_duration(2 * axis.step) if axis.step else 'e.g. 12h'}, ...)"
        )
    return format_duration(ns)


def on_frequency(axis: StepAxis, frequency: str) -> np.ndarray:
    """``(n,)``: samples whose time is a whole number of ``frequency`` after the first stored time."""
    ns = parse_duration(frequency, "frequency")
    first = axis.ticks[np.argmax(axis.stored)] if axis.stored.any() else 0
    return axis.stored & ((axis.ticks - first) % ns == 0)


@dataclass(frozen=True)
class SplitLoss:
    """Anchors of one split its times took: how many per rule, and the first times named."""

    unstored: int
    unstored_times: tuple[str, ...]
    missing: int
    missing_times: tuple[str, ...]
    off_frequency: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "unstored": self.unstored,
            "unstored_times": list(self.unstored_times),
            "missing": self.missing,
            "missing_times": list(self.missing_times),
            "off_frequency": self.off_frequency,
        }


def _named(times: list[str], total: int) -> str:
    more = f" and {total - len(times)} more" if total > len(times) else ""
    return ", ".join(times) + more


def loss_note(name: str, loss: Mapping[str, Any]) -> str:
    """One sentence: what split ``name`` lost to its times (a ``SplitLoss.as_dict()``)."""
    parts = []
    if loss["unstored"] and not loss["unstored_times"]:
        parts.append(f"{loss['unstored']} that read rows no store holds (padding between concatenated stores)")
    elif loss["unstored"]:
        parts.append(
            f"{loss['unstored']} whose offsets in time want times the archive does not store "
            f"(first {', '.join(loss['unstored_times'])})"
        )
    if loss["missing"]:
        parts.append(
            f"{loss['missing']} whose window touches a declared missing date (first {', '.join(loss['missing_times'])})"
        )
    if loss["off_frequency"]:
        parts.append(f"{loss['off_frequency']} off the frequency")
    return f"split {name!r} drops anchors: " + "; ".join(parts)


@dataclass(frozen=True, eq=False)
class AnchorRules:
    """Per anchor of the grid: whether its times let a pass draw it, and why not.

    ``keep`` is ``None`` when no rule applies (every anchor may be drawn, the plan is unchanged).
    """

    keep: np.ndarray | None
    unstored: np.ndarray | None
    missing: np.ndarray | None
    off_frequency: np.ndarray | None
    labels: Mapping[str, ArrayGeometry]
    missing_at: np.ndarray | None
    axis: StepAxis | None
    declared: tuple[tuple[str, str], ...] = ()  # the manifest's missing dates, for a label read on another axis
    padding: np.ndarray | None = None  # anchors a label of which reads a row no store holds (part of ``unstored``)

    def _unstored_times(self, anchors: np.ndarray) -> list[str]:
        found: set[str] = set()
        for g in self.labels.values():
            if g.time_rows is not None:
                found.update(g.time_rows.missing_times(anchors))
        return sorted(found)

    def _missing_times(self, anchors: np.ndarray) -> list[str]:
        if self.missing_at is None or self.axis is None:
            return []
        ticks: set[int] = set()
        named: set[str] = set()
        for g in self.labels.values():
            axis, at = _read_missing(g, self.axis, self.missing_at, self.declared)
            rows = _rows_inside(g, anchors, len(at))
            hit = rows >= 0
            hit[hit] = at[rows[hit]]
            if axis is self.axis:
                ticks.update(self.axis.ticks[rows[hit]].tolist())
            else:  # a joined store's label: its own axis names its times
                named.update(axis.exact(t) for t in axis.ticks[rows[hit]].tolist())
        ticks.update(self.axis.ticks[anchors[self.missing_at[anchors]]].tolist())
        return sorted(named | {self.axis.exact(t) for t in ticks})

    def loss(self, anchors: np.ndarray) -> SplitLoss:
        """What the rules take of ``anchors`` (a split's, inside the valid range): counts, first times.

        Each anchor counts once, under the first rule that takes it: off the
        frequency, then not stored, then missing; the counts add up to the anchors dropped.
        """
        anchors = np.asarray(anchors, dtype=np.int64)
        off = int(self.off_frequency[anchors].sum()) if self.off_frequency is not None else 0
        if self.off_frequency is not None:
            anchors = anchors[~self.off_frequency[anchors]]
        unstored = anchors[self.unstored[anchors]] if self.unstored is not None else anchors[:0]
        if self.unstored is not None:
            anchors = anchors[~self.unstored[anchors]]
        missing = anchors[self.missing[anchors]] if self.missing is not None else anchors[:0]
        return SplitLoss(
            unstored=len(unstored),
            unstored_times=tuple(self._unstored_times(unstored[: NAMED_TIMES * 4])[:NAMED_TIMES]),
            missing=len(missing),
            missing_times=tuple(self._missing_times(missing[: NAMED_TIMES * 4])[:NAMED_TIMES]),
            off_frequency=off,
        )

    def check_inference(self, lo: int, hi: int) -> None:
        """Raise :class:`TimeAxisError` when an anchor of ``[lo, hi)`` wants a time not stored or declared missing."""
        if self.keep is None:
            return
        anchors = np.arange(lo, hi, dtype=np.int64)
        for skipped in (self.off_frequency, self.padding):
            if skipped is not None:
                anchors = anchors[~skipped[anchors]]
        for rule, times, why in (
            (self.unstored, self._unstored_times, "the archive does not store"),
            (self.missing, self._missing_times, "are declared missing"),
        ):
            if rule is None or not rule[anchors].any():
                continue
            bad = anchors[rule[anchors]]
            named = times(bad)
            raise TimeAxisError(
                f"inference over anchors [{lo}, {hi}): {len(bad)} anchor(s) read times that {why}: "
                f"{_named(named[:NAMED_TIMES], len(named))} (first anchor {int(bad[0])}, at "
                f"{self.axis.exact(self.axis.ticks[bad[0]]) if self.axis is not None else bad[0]}); "
                "infer over a range without them (start=/stop=), or train, which drops them"
            )


def _rows_inside(g: ArrayGeometry, anchors: np.ndarray, n: int) -> np.ndarray:
    """``g``'s read indices of ``anchors``, ``-1`` where off the array or not stored."""
    rows = g.read_rows(anchors)
    return np.where((rows >= 0) & (rows < n), rows, -1)


def _read_missing(
    g: ArrayGeometry, axis: StepAxis, missing_at: np.ndarray, declared: tuple[tuple[str, str], ...]
) -> tuple[StepAxis, np.ndarray]:
    """The axis ``g`` reads rows of, and which of them are declared missing: the anchors' own, or a joined store's."""
    read = g.time_rows.read_axis if g.time_rows is not None else None
    if read is None:
        return axis, missing_at
    return read, missing_samples(read, declared)


def _time_axis(variables: Mapping[str, ArrayGeometry], what: str) -> StepAxis:
    for g in variables.values():
        if g.time_rows is not None:
            return g.time_rows.axis
    tried = []
    for g in variables.values():
        try:
            return g.step_axis(what)
        except (TimeAxisError, CalendarError) as exc:
            tried.append(str(exc))
    raise TimeAxisError(f"{what} needs the sample axis's time coordinate: " + "; ".join(tried))


def anchor_rules(manifest: Any, variables: Mapping[str, ArrayGeometry]) -> AnchorRules:
    """The rules for ``manifest``'s anchor grid (its ``missing`` and ``frequency``) and ``variables``' offsets."""
    n = int(manifest.n_samples)
    timed = {label: g for label, g in variables.items() if g.time_rows is not None}
    missing_dates = tuple(getattr(manifest, "missing", ()))
    frequency = getattr(manifest, "frequency", None)
    padding = _padding(variables, n)
    if not timed and not missing_dates and frequency is None and padding is None:
        return AnchorRules(None, None, None, None, variables, None, None)
    dated = timed or missing_dates or frequency is not None
    axis = _time_axis(variables, "missing dates and frequency") if dated else None
    unstored = np.zeros(n, dtype=bool) if padding is None else padding.copy()
    for g in timed.values():
        unstored |= ~g.time_rows.valid()  # type: ignore[union-attr]
    missing = missing_at = None
    if missing_dates and axis is not None:
        missing_at = missing_samples(axis, missing_dates)
        missing = missing_at.copy()
        everyone = np.arange(n, dtype=np.int64)
        for g in variables.values():
            _, at = _read_missing(g, axis, missing_at, missing_dates)
            rows = _rows_inside(g, everyone, len(at))
            hit = np.zeros(rows.shape, dtype=bool)
            hit[rows >= 0] = at[rows[rows >= 0]]
            missing |= hit.any(axis=1)
    off = ~on_frequency(axis, frequency) if frequency is not None and axis is not None else None
    keep = ~unstored
    for rule in (missing, off):
        if rule is not None:
            keep &= ~rule
    unstored_rule = unstored if timed or padding is not None else None
    return AnchorRules(keep, unstored_rule, missing, off, variables, missing_at, axis, missing_dates, padding)


def _padding(variables: Mapping[str, ArrayGeometry], n: int) -> np.ndarray | None:
    """``(n,)``: anchors a label of which reads a row its array declares no store holds; ``None`` when none does."""
    out = np.zeros(n, dtype=bool)
    for g in variables.values():
        dims = g.dimension_names
        dim = dims[g.sample_axis] if dims else None
        absent = unstored_rows(getattr(g.metadata, "attributes", None), dim, g.n_samples)
        if absent is not None and (g.time_rows is None or g.time_rows.read_axis is None):  # not a joined store's axis
            rows = _rows_inside(g, np.arange(n, dtype=np.int64), len(absent))
            out |= np.asarray(((rows >= 0) & absent[np.maximum(rows, 0)]).any(axis=1))
    return out if out.any() else None


def rows_kept(
    rows: np.ndarray, counts: np.ndarray, keep: np.ndarray | None, chunk_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Ledger rows ``[chunk, within]`` (``counts`` per chunk) whose anchor ``keep`` allows."""
    if keep is None or not len(rows):
        return rows, counts
    mine = keep[rows[:, 0] * chunk_size + rows[:, 1]]
    owner = np.repeat(np.arange(len(counts)), counts)
    return rows[mine], np.bincount(owner[mine], minlength=len(counts)).astype(counts.dtype)


def split_losses(
    manifest: Any, variables: Mapping[str, ArrayGeometry], rules: AnchorRules | None = None
) -> dict[str, dict[str, Any]]:
    """Per split of ``manifest`` that loses anchors to its times: how many per rule, the first times named.

    Counts anchors inside the valid range (a window off the array is no loss of time); ``rules`` default to
    :func:`anchor_rules` of ``manifest`` and ``variables``.
    """
    rules = anchor_rules(manifest, variables) if rules is None else rules
    if rules.keep is None:
        return {}
    lo, hi = valid_anchor_range(manifest, variables)
    out = {}
    for name in manifest.names:
        anchors = manifest.sample_indices(name)
        loss = rules.loss(anchors[(anchors >= lo) & (anchors < hi)]).as_dict()
        if loss["unstored"] or loss["missing"] or loss["off_frequency"]:
            out[name] = loss
    return out


def declare_times(
    geometry: ArrayGeometry, missing: Iterable[Any] | None, frequency: Any
) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """A splitter's ``missing=`` and ``frequency=`` as the manifest records them, checked against
    ``geometry``'s time coordinate (read only when either is given).

    Raises
    ------
    TimeAxisError
        The array has no time coordinate, or the frequency is no multiple of its step.
    TypeError, ValueError
        As :func:`declare_missing`.
    """
    if missing is None and frequency is None:
        return (), None
    axis = geometry.step_axis("missing= and frequency=")
    what = f"array {geometry.path!r}"
    return declare_missing(axis, missing, what), declare_frequency(axis, frequency, what)


def times_lines(manifest: Any, variables: Mapping[str, ArrayGeometry] | None) -> list[str]:
    """The lines ``SplitManifest.describe`` adds: its missing dates and frequency, and with
    ``variables`` (``{label: ArrayGeometry}``) each split's anchors lost to its times."""
    lines = []
    if manifest.missing:
        dates = ", ".join(a if a == b else f"{a} .. {b}" for a, b in manifest.missing)
        lines.append(f"  missing: {dates}: no anchor whose window touches them is drawn")
    if manifest.frequency is not None:
        lines.append(f"  frequency: an anchor every {manifest.frequency}, counted from the first date")
    for name, loss in (split_losses(manifest, variables) if variables is not None else {}).items():
        lines.append(f"  {loss_note(name, loss)}")
    return lines


def with_declared_times(manifest: Any, variables: Mapping[str, ArrayGeometry], missing: Any, frequency: Any) -> Any:
    """``manifest`` with a dataset's ``missing=`` and ``frequency=`` added (``manifest`` itself when neither).

    The missing dates join the manifest's; a frequency is the manifest's or
    the dataset's, not two. ``variables`` supply the time coordinate (the
    manifest's own array first).

    Raises
    ------
    ValueError
        Two different frequencies.
    TimeAxisError, TypeError
        As the splitters' ``missing=``/``frequency=``.
    """
    if missing is None and frequency is None:
        return manifest
    ordered = sorted(variables.values(), key=lambda g: g.path != manifest.array)
    missing_dates, spacing = declare_times(ordered[0], missing, frequency)
    if spacing is not None and manifest.frequency not in (None, spacing):
        raise ValueError(
            f"frequency={frequency!r} differs from the manifest's {manifest.frequency!r}: give one (the manifest "
            "records it for every split and rank)"
        )
    added = tuple(m for m in missing_dates if m not in manifest.missing)
    return dataclasses.replace(
        manifest, missing=manifest.missing + added, frequency=spacing if spacing is not None else manifest.frequency
    )
