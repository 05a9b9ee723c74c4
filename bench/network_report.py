"""The network scenarios' section of the report: one table of their runs, one of the ratios each took within its run.

``bench.network`` prints it; ``bench.run``'s report (``bench.report_markdown``)
includes it when the full profile measured the scenarios.
"""

from __future__ import annotations

import math
from typing import Any

from .rows import rate

__all__ = ["markdown"]


def _f(value: Any, digits: int = 2) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """The network section of the report."""
    lines = ["## Network scenarios", ""]
    # each scenario's result is a dict, in the order they were measured (beside the run's profile and dataset)
    scenarios = {name: found for name, found in results.items() if isinstance(found, dict)}
    rows = [r for found in scenarios.values() for r in found.get("rows", [])]
    if rows:
        lines += [
            "| run | samples/s | CPU µs/sample | limit (min/median/max) | hedged (won) | throttled | stalls |",
            "|---|---:|---:|---|---:|---:|---:|",
        ]
        for r in rows:
            last = r.get("last_pass") or {}
            limit = (
                f"{last.get('inflight_min')}/{last.get('inflight_median')}/{last.get('inflight_max')}" if last else "—"
            )
            hedged = f"{last.get('hedged')} ({last.get('hedge_wins')})" if last else "—"
            lines.append(
                f"| {r.get('name')} | {_f(rate(r), 0)} | {_f(r.get('cpu_us_per_sample'), 0)} | {limit} | {hedged} "
                f"| {last.get('throttled', '—')} | {last.get('stalls', '—')} |"
            )
    lines += ["", "| ratio (one run) | value |", "|---|---:|"]
    for name, found in scenarios.items():
        for key, value in found.items():
            if isinstance(value, (int, float)) and key != "elapsed_s" and not isinstance(value, bool):
                lines.append(f"| {name}: {key} | {_f(float(value))} |")
    return "\n".join(lines) + "\n"
