"""The report as Markdown: the loader tables, the bars, the memory pass, the fork probe, the sweeps, the plots.

:func:`markdown` renders the ``results`` dict ``bench.run`` writes to
``results.json`` (the same text goes to ``report.md`` and to the terminal);
docs/bench/report.md is one such report, copied from a full run.
"""

from __future__ import annotations

import math
from typing import Any

from .network_report import markdown as network_markdown
from .provenance import stamp_line
from .rows import rate

__all__ = ["markdown"]

_FORK_VARIANT_TEXT = {
    "inherit": "the parent opened the store and read; workers use the inherited store",
    "reopen": "the parent read through obstore; each worker opens a new store",
    "clean": "the parent never touched obstore; each worker opens its own store",
}


def _fmt(x: Any, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def markdown(results: dict[str, Any]) -> str:
    """The report as Markdown: tables, ratios, bars, findings, plots."""
    meta = results["meta"]
    lines = [
        f"# insitubatch benchmark ({meta['profile']})",
        "",
        f"Emulated store: {meta['emulator']['latency_s'] * 1e3:.0f} ms + up to "
        f"{meta['emulator']['jitter_s'] * 1e3:.0f} ms jitter to first byte, "
        f"{_fmt(meta['emulator']['bandwidth_mb_s'], '.0f')} MB/s per connection; {meta['cpu_count']} CPUs; "
        f"batch size {meta['batch_size']}; insitubatch {meta['insitu_knobs']}.",
        f"Command: `{meta['command']}`; {meta['elapsed_s']:.0f} s.",
        "",
        f"{stamp_line(meta['measured'])}." if meta.get("measured") else "Measured: date and commit not recorded.",
        "",
    ]
    header = (
        "| loader | samples/s | MB/s | TTFB s | peak RSS MB | GETs | min GETs | insitu × |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for spc, rows in results["tables"].items():
        r = results["ratios"][spc]
        lines += [f"## {spc} sample(s) per chunk", "", header]
        for row in rows:
            if row.get("error"):
                lines.append(f"| {row['name']} | error: {row['error']} |||||||")
                continue
            lines.append(
                f"| {row['name']} | {_fmt(rate(row))} | {_fmt(row.get('mb_per_s'))} | {_fmt(row.get('ttfb_s'), '.2f')} "
                f"| {_fmt(row.get('peak_rss_mb'), '.0f')} | {_fmt(row.get('gets'), 'd')} | {_fmt(row.get('min_gets'), 'd')} "
                f"| {_fmt(r['insitu_over'].get(row['name']), '.2f')} |"
            )
        lines.append("")
    lines += ["## Bars", "", "| bar | samples/chunk | measured | target | verdict |", "|---|---:|---:|---:|---|"]
    for b in results["bars"]:
        verdict = {True: "pass", False: "MISS", None: "n/a"}[b["passed"]]
        note = f" ({b['note']})" if b.get("note") else ""
        lines.append(
            f"| {b['bar']}{note} | {b['spc']} | {_fmt(b['measured'], '.2f')} | {_fmt(b['target'], '.2f')} | {verdict} |"
        )
    mem = results.get("memory") or {}
    if mem and not mem.get("error"):
        over_base = mem["peak_rss_mb"] - mem["base_rss_mb"]
        lines += [
            "",
            "## Memory: a cold pass over a split many times the pool budget",
            "",
            f"Split {_fmt(mem.get('split_mb'), '.0f')} MB = {_fmt(mem.get('split_over_budget'), '.1f')} × the "
            f"automatic budget (working set {_fmt(mem.get('working_set_mb'), '.1f')} MB, block_chunks "
            f"{mem['config'].get('block_chunks')}).",
            "",
            "| peak RSS MB | RSS before the pass MB | peak − before MB | `insitubatch inspect` bound MB |",
            "|---:|---:|---:|---:|",
            f"| {_fmt(mem['peak_rss_mb'], '.0f')} | {_fmt(mem['base_rss_mb'], '.0f')} | {_fmt(over_base, '.0f')} "
            f"| {_fmt(mem.get('inspect_bound_mb'), '.1f')} |",
        ]
    lines += ["", "## Fork probe (DataLoader, 2 fork workers)", ""]
    for p in results["findings"]["fork"]:
        detail = p.get("error") or (
            f"no batch within {p.get('timeout_s')} s"
            if p.get("outcome") == "hang"
            else f"first batch after {_fmt(p.get('seconds'), '.1f')} s"
        )
        what = _FORK_VARIANT_TEXT.get(p.get("variant") or p.get("config", {}).get("variant"), "")
        lines.append(f"- `{p['name']}` ({what}): **{p.get('outcome', p.get('error'))}**, {detail}")
    lines += [f"- note: {n}" for n in results["findings"].get("notes", [])]
    lines += ["", "## Samples-per-chunk sweep (samples/s)", ""]
    sweep = results["sweeps"]["samples_per_chunk"]
    spcs = sorted({r["spc"] for r in sweep})
    lines += ["| loader | " + " | ".join(str(x) for x in spcs) + " |", "|---|" + "---:|" * len(spcs)]
    for series in sorted({r["series"] for r in sweep}):
        got = {r["spc"]: rate(r) for r in sweep if r["series"] == series}
        lines.append(f"| {series} | " + " | ".join(_fmt(got.get(x)) for x in spcs) + " |")
    lines += ["", f"## max_inflight sweep (samples/s, {results['meta']['main_spc']} samples per chunk)", ""]
    mi_rows = results["sweeps"]["max_inflight"]
    values = sorted({r["config"].get("max_inflight") or r["config"].get("concurrency") for r in mi_rows})
    lines += ["| | " + " | ".join(str(v) for v in values) + " |", "|---|" + "---:|" * len(values)]
    for loader, label in (("insitu", "insitubatch"), ("get_ceiling", "raw GET ceiling")):
        got = {
            r["config"].get("max_inflight") or r["config"].get("concurrency"): rate(r)
            for r in mi_rows
            if r["loader"] == loader
        }
        lines.append(f"| {label} | " + " | ".join(_fmt(got.get(v)) for v in values) + " |")
    if results.get("network"):
        lines += ["", network_markdown(results["network"]).rstrip()]
    if results.get("arena"):
        arena = results["arena"]
        lines += [
            "",
            "## Realistic fields: the arena",
            "",
            f"The full tables are in [{arena['report']}]({arena['report']}) beside this report; its bars:",
            "",
        ]
        lines += [f"- {_arena_bar(b)}" for b in arena["bars"]]
    lines += ["", "## Plots", ""] + [f"- {p}" for p in results.get("plots", [])]
    return "\n".join(lines) + "\n"


def _arena_bar(bar: dict[str, Any]) -> str:
    """One of the arena's bars as a line: what, the value measured, the bar and whether it was met."""
    value = "not measured" if bar.get("value") is None else f"{bar['value']:.2f}"
    verdict = "met" if bar.get("met") else "missed"
    return f"{bar['what']}: {value} (bar {bar['bar']}, {verdict})"
