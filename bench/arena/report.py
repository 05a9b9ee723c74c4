"""The arena's ratios, its bars (met or not), and the table and report it prints and writes.

Every ratio is of two rows of the same run (:func:`ratios`); a ratio with a
missing side (a skipped peer, a failed row, a scenario left out) is
``None`` and its bar says "not measured", never met.
"""

from __future__ import annotations

import math
from typing import Any

from ..rows import ratio
from .scenarios import SCENARIOS

__all__ = ["BARS", "Bar", "bars", "markdown", "ratios", "table"]

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
        found = {
            "ours_over_reference": ratio(_num(ours, rate), _num(ref, rate)),
            "ours_over_tensorstore": ratio(_num(ours, rate), _num(ts, rate)),
            "cpu_ours_over_reference": ratio(_num(ours, cpu), _num(ref, cpu)),
            "cpu_ours_over_tensorstore": ratio(_num(ours, cpu), _num(ts, cpu)),
            "rss_ours_over_reference": ratio(_num(ours, rss), _num(ref, rss)),
            "rss_ours_over_tensorstore": ratio(_num(ours, rss), _num(ts, rss)),
            "over_get_ceiling": ratio(_num(ours, rate), _num(rows.get("get_ceiling"), rate)),
        }
        if name == "local":
            found["over_decode_ceiling"] = ratio(_num(ours, rate), _num(decode, rate))
        else:
            found["cpu_over_local"] = ratio(_num(ours, cpu), _num(local, cpu))
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
    lines += ["", table(results), "", "## Ratios (within this run)", "", "| ratio | value |", "|---|---:|"]
    lines += [f"| {k} | {_fmt(v, 2)} |" for k, v in results.get("ratios", {}).items()]
    lines += ["", "## Bars", "", "| bar | value | target | met |", "|---|---:|---|---|"]
    for b in results.get("bars", []):
        met = "not measured" if b["met"] is None else ("met" if b["met"] else "NOT MET")
        lines.append(f"| {b['what']} | {_fmt(b['value'], 2)} | {b['bar']} | {met} |")
    return "\n".join(lines) + "\n"
