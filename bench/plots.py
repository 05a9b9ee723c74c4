"""The report's PNG plots: throughput against samples per chunk and against max_inflight, time to first batch, peak RSS.

Drawn with matplotlib (the ``bench`` extra) when it is installed; without
it :func:`plots` draws nothing and the report lists no plots.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .rows import by_name, rate

__all__ = ["plots"]


def plots(results: dict[str, Any], out: Path) -> list[str]:
    """Throughput vs samples-per-chunk, throughput vs max_inflight, TTFB and RSS bars (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))

    sweep = results["sweeps"]["samples_per_chunk"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for series in sorted({r["series"] for r in sweep}):
        pts = sorted((r["spc"], rate(r)) for r in sweep if r["series"] == series and not math.isnan(rate(r)))
        if pts:
            style = "--" if "ceiling" in series else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=series)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="samples per chunk",
        ylabel="samples/s",
        title="Throughput vs samples per chunk",
    )
    ax.set_xticks(sorted({r["spc"] for r in sweep}), labels=[str(s) for s in sorted({r["spc"] for r in sweep})])
    ax.legend(fontsize=8)
    save(fig, "throughput_vs_samples_per_chunk.png")

    mi = results["sweeps"]["max_inflight"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for loader, label in (("insitu", "insitubatch"), ("get_ceiling", "raw GET ceiling")):
        pts = sorted(
            (r["config"].get("max_inflight") or r["config"].get("concurrency"), rate(r))
            for r in mi
            if r["loader"] == loader and not math.isnan(rate(r))
        )
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    main_rows = results["tables"].get(str(results["meta"]["main_spc"]), [])
    decode = by_name(main_rows, "decode-ceiling")
    if decode:
        ax.axhline(rate(decode), linestyle="--", color="grey", label="decode-bound ceiling")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="max_inflight",
        ylabel="samples/s",
        title=f"Throughput vs max_inflight ({results['meta']['main_spc']} samples per chunk)",
    )
    ax.legend(fontsize=8)
    save(fig, "throughput_vs_max_inflight.png")

    rows = [r for r in main_rows if r.get("ttfb_s") is not None and not r.get("error")]
    for key, name, label in (
        ("ttfb_s", "ttfb.png", "time to first batch (s)"),
        ("peak_rss_mb", "rss.png", "peak RSS of the process tree (MB)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        names = [r["name"] for r in rows]
        values = [r.get(key) or 0.0 for r in rows]
        colors = ["tab:green" if r["loader"].startswith("insitu") else "tab:grey" for r in rows]
        ax.barh(names, values, color=colors)
        if key == "peak_rss_mb":  # the interpreter and its imports, before the loader started
            ax.barh(
                names,
                [r.get("base_rss_mb") or 0.0 for r in rows],
                color="white",
                alpha=0.5,
                hatch="//",
                edgecolor="black",
                label="before the loader (interpreter + imports)",
            )
            ax.legend(fontsize=8, loc="lower right")
        ax.invert_yaxis()
        ax.set(xlabel=label, title=f"{label} ({results['meta']['main_spc']} samples per chunk)")
        save(fig, name)
    return paths
