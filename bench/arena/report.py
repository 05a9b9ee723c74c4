"""The arena's ratios, its bars (met or not), and the tables and report it prints and writes.

Every ratio is of two rows of the same run (:func:`ratios`); a ratio with a
missing side (a skipped peer, a failed row, a scenario left out) is
``None`` and its bar says "not measured", never met. The steady-state rows
have one table (:func:`table`), the cold passes another (:func:`cold_table`),
their ratios named ``<scenario>.cold_...``.
"""

from __future__ import annotations

import math
from typing import Any

from ..rows import ratio
from .scenarios import SCENARIOS

__all__ = ["BARS", "Bar", "bars", "cold_table", "markdown", "ratios", "table"]

# CPU per sample compared with local files over these links (both at 0 ms: the protocol's own cost).
CPU_VS_LOCAL = ("http0", "s3")


class Bar:
    """One bar of issue 38: the ratio it reads, the comparison and the threshold."""

    def __init__(self, key: str, what: str, op: str, threshold: float) -> None:
        self.key, self.what, self.op, self.threshold = key, what, op, threshold

    def evaluate(self, value: float | None) -> dict[str, Any]:
        met = None if value is None else (value <= self.threshold if self.op == "<=" else value >= self.threshold)
        return {"key": self.key, "what": self.what, "bar": f"{self.op} {self.threshold:g}x", "value": value, "met": met}


BARS = (
    Bar("s3.cpu_ours_over_reference", "CPU per sample over S3 at 0 ms, ours / reference", "<=", 0.6),
    Bar("http0.cpu_over_local", "CPU per sample over HTTP at 0 ms / local files (ours)", "<=", 1.3),
    Bar("s3.cpu_over_local", "CPU per sample over S3 at 0 ms / local files (ours)", "<=", 1.3),
    Bar("local.ours_over_reference", "samples/s on local files, ours / reference", ">=", 2.5),
    Bar("local.over_decode_ceiling", "local files / the decode ceiling (ours, samples/s)", ">=", 0.9),
    Bar("tail40.rss_ours_over_reference", "peak RSS on tail40, ours / reference", "<=", 1.2),
    Bar("tail40.ours_over_reference", "samples/s on tail40, ours / reference", ">=", 3.0),
    Bar("stragglers.ours_over_reference", "samples/s with stragglers, ours / reference", ">=", 1.5),
    # issue 45: one cold pass (open included) at our defaults against TensorStore with a cache that holds the split
    Bar(
        "http0.cold_ours_over_tensorstore",
        "one cold pass over HTTP 0 ms, ours / TensorStore (cache holds the split)",
        ">=",
        1.5,
    ),
    Bar(
        "http30.cold_ours_over_tensorstore",
        "one cold pass over HTTP 30 ms, ours / TensorStore (cache holds the split)",
        ">=",
        1.5,
    ),
)


def _num(row: dict[str, Any] | None, key: str) -> float:
    if not row or row.get("error") or row.get("skipped"):
        return math.nan
    value = row.get(key)
    return float(value) if value is not None else math.nan


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """``{"<scenario>.<ratio>": value}`` for every scenario measured; ``None`` where a side is missing."""
    out: dict[str, float | None] = {}
    scenarios = results.get("scenarios", {})
    local = scenarios.get("local", {}).get("rows", {}).get("ours")
    decode = results.get("decode_ceiling")
    for name, scenario in scenarios.items():
        rows = scenario.get("rows", {})
        ours, ref, ts = rows.get("ours"), rows.get("reference"), rows.get("tensorstore")
        rate, cpu, rss = "rate_samples_per_s", "cpu_s_per_sample", "peak_rss_mb"
        found: dict[str, float] = {}
        if rows:  # steady state measured (a --cold-only run has none)
            found.update(
                ours_over_reference=ratio(_num(ours, rate), _num(ref, rate)),
                ours_over_tensorstore=ratio(_num(ours, rate), _num(ts, rate)),
                cpu_ours_over_reference=ratio(_num(ours, cpu), _num(ref, cpu)),
                cpu_ours_over_tensorstore=ratio(_num(ours, cpu), _num(ts, cpu)),
                rss_ours_over_reference=ratio(_num(ours, rss), _num(ref, rss)),
                rss_ours_over_tensorstore=ratio(_num(ours, rss), _num(ts, rss)),
                over_get_ceiling=ratio(_num(ours, rate), _num(rows.get("get_ceiling"), rate)),
            )
            if name == "local":
                found["over_decode_ceiling"] = ratio(_num(ours, rate), _num(decode, rate))
            else:
                found["cpu_over_local"] = ratio(_num(ours, cpu), _num(local, cpu))
        if "cold_rows" in scenario:
            cold = scenario["cold_rows"]
            ours, ref, ts = cold.get("ours"), cold.get("reference"), cold.get("tensorstore")
            found.update(
                cold_ours_over_tensorstore=ratio(_num(ours, rate), _num(ts, rate)),
                cold_ours_over_reference=ratio(_num(ours, rate), _num(ref, rate)),
                cold_cpu_ours_over_tensorstore=ratio(_num(ours, cpu), _num(ts, cpu)),
                cold_rss_ours_over_tensorstore=ratio(_num(ours, rss), _num(ts, rss)),
            )
        out.update({f"{name}.{k}": _finite(v) for k, v in found.items()})
    return out


def bars(found: dict[str, float | None]) -> list[dict[str, Any]]:
    """Every bar of :data:`BARS` against the ratios of this run."""
    return [b.evaluate(found.get(b.key)) for b in BARS]


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


_HEADER = (
    "| scenario | loader | samples/s | CPU ms/sample | peak RSS MB | RSS before MB | bound MB | within | GETs | load |",
    "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
)


def _row_line(scenario: str, label: str, row: dict[str, Any]) -> str:
    if row.get("skipped"):
        return f"| {scenario} | {label} | skipped: {row['skipped']} |||||||| |"
    if row.get("error"):
        return f"| {scenario} | {label} | error: {row['error'][:160]} |||||||| |"
    cpu = row.get("cpu_s_per_sample")
    load = row.get("loadavg_end") or [None]
    return (
        f"| {scenario} | {label} | {_fmt(row.get('rate_samples_per_s'))} | {_fmt(None if cpu is None else 1e3 * cpu, 2)}"
        f" | {_fmt(row.get('peak_rss_mb'), 0)} | {_fmt(row.get('base_rss_mb'), 0)} | {_fmt(row.get('bound_mb'), 0)}"
        f" | {_fmt(row.get('within_bound'))} | {_fmt(row.get('gets'))} | {_fmt(load[0], 2)} |"
    )


def _label(loader: str, row: dict[str, Any]) -> str:
    if loader == "get_ceiling":
        return f"raw-GET ceiling ({row.get('concurrency', '?')} in flight)"
    if loader == "decode_ceiling":
        return f"decode ceiling ({row.get('threads', '?')} threads)"
    return loader


def table(results: dict[str, Any]) -> str:
    """The rows of every scenario, ceilings included, as one markdown table."""
    lines = list(_HEADER)
    for name, scenario in results.get("scenarios", {}).items():
        for loader, row in scenario.get("rows", {}).items():
            lines.append(_row_line(name, _label(loader, row), row))
    decode = results.get("decode_ceiling")
    if decode:
        lines.append(_row_line("(no I/O)", _label("decode_ceiling", decode), decode))
    return "\n".join(lines)


_COLD_HEADER = (
    "| scenario | loader | samples/s | open s | first batch s | 1st half /s | 2nd half /s | 1st tenth /s"
    " | last tenth /s | CPU ms/sample | peak RSS MB | cache MB | GETs | load |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
)


def _cold_line(scenario: str, loader: str, row: dict[str, Any]) -> str:
    if row.get("skipped") or row.get("error"):
        what = f"skipped: {row['skipped']}" if row.get("skipped") else f"error: {row['error'][:160]}"
        return f"| {scenario} | {loader} | {what} ||||||||||| |"
    cpu = row.get("cpu_s_per_sample")
    load = row.get("loadavg_end") or [None]
    parts = row.get("parts") or [{}]
    cache = row.get("cache_mb")
    cache_is = f"{_fmt(cache, 0)} ({row.get('cache_is')})" if cache is not None else "–"
    return (
        f"| {scenario} | {loader} | {_fmt(row.get('rate_samples_per_s'))} | {_fmt(row.get('open_s'), 2)}"
        f" | {_fmt(row.get('first_batch_s'), 2)} | {_fmt(row.get('first_half_samples_per_s'))}"
        f" | {_fmt(row.get('second_half_samples_per_s'))} | {_fmt(parts[0].get('samples_per_s'))}"
        f" | {_fmt(parts[-1].get('samples_per_s'))} | {_fmt(None if cpu is None else 1e3 * cpu, 2)}"
        f" | {_fmt(row.get('peak_rss_mb'), 0)} | {cache_is} | {_fmt(row.get('gets'))} | {_fmt(load[0], 2)} |"
    )


def cold_table(results: dict[str, Any]) -> str:
    """The cold passes of every scenario that has them, as one markdown table (empty when none has)."""
    lines = [
        _cold_line(name, loader, row)
        for name, scenario in results.get("scenarios", {}).items()
        for loader, row in scenario.get("cold_rows", {}).items()
    ]
    return "\n".join([*_COLD_HEADER, *lines]) if lines else ""


def _ramp(results: dict[str, Any]) -> list[str]:
    """Our cold passes' reads in flight at each tenth: the automatic limit, and the most reached so far."""
    lines = []
    for name, scenario in results.get("scenarios", {}).items():
        ours = scenario.get("cold_rows", {}).get("ours") or {}
        parts, first = ours.get("parts") or [], ours.get("first_probe") or {}
        if parts and "max_inflight" in parts[0]:
            steps = ", ".join(f"{p['max_inflight']}/{p['inflight_peak']}" for p in parts)
            at_first = f"{first['max_inflight']}/{first['inflight_peak']}" if "max_inflight" in first else "–"
            lines.append(f"- {name}: first batch {at_first}; tenths {steps}")
    if lines:
        lines.insert(
            0,
            "Ours, reads in flight in the cold pass (limit / most reached so far), at the first batch and each tenth:",
        )
        lines.insert(1, "")
    return lines


def markdown(results: dict[str, Any]) -> str:
    """The arena's report: what was run, the table, the ratios and the bars."""
    meta = results.get("meta", {})
    spec = meta.get("dataset", {})
    lines = [
        "# The arena: realistic fields, peers measured in the same run",
        "",
        f"Command: `{meta.get('command', '')}` ({meta.get('profile')} profile, {meta.get('elapsed_s', 0):.0f} s);"
        f" load average at the start {meta.get('loadavg_start')}, at the end {meta.get('loadavg_end')}"
        f" on {meta.get('cpu_count')} cores.",
        "",
        f"Data: {spec.get('name')}: {len(spec.get('variables', []))} float32 variables of"
        f" {spec.get('n_lat')} x {spec.get('n_lon')}, chunks {spec.get('chunks')}, {spec.get('codec')};"
        f" {spec.get('train_samples')} training samples (split {meta.get('fractions')} by chunk); batch size"
        f" {meta.get('batch_size')}. Each loader in a fresh child process at its default knobs; steady state:"
        f" {meta.get('timing')}.",
        "",
        "Scenarios: " + "; ".join(f"`{n}` {SCENARIOS[n].what}" for n in results.get("scenarios", {})) + ".",
        "",
    ]
    for peer, info in meta.get("peers", {}).items():
        lines.append(f"- {peer}: " + (f"skipped: {info['skipped']}" if info.get("skipped") else info.get("what", "")))
    if any(scenario.get("rows") for scenario in results.get("scenarios", {}).values()):
        lines += ["", table(results)]
    lines.append("")
    cold = cold_table(results)
    if cold:
        lines += ["## One cold pass", "", f"{meta.get('cold') or ''}", "", cold, "", *_ramp(results), ""]
    lines += ["## Ratios (within this run)", "", "| ratio | value |", "|---|---:|"]
    lines += [f"| {k} | {_fmt(v, 2)} |" for k, v in results.get("ratios", {}).items()]
    lines += ["", "## Bars", "", "| bar | value | target | met |", "|---|---:|---|---|"]
    for b in results.get("bars", []):
        met = "not measured" if b["met"] is None else ("met" if b["met"] else "NOT MET")
        lines.append(f"| {b['what']} | {_fmt(b['value'], 2)} | {b['bar']} | {met} |")
    return "\n".join(lines) + "\n"
