"""Print the kernel ratio table from a pytest-benchmark JSON file.

    python bench/report_kernels.py [RESULT.json ...]

With no argument, reads the newest file under ``.benchmarks/``. For every
group of ``bench/test_bench_kernels.py`` it prints median times and

- ``x memcpy``: memcpy time / kernel time — the fraction of the bandwidth
  limit the kernel reaches (1.0 = as fast as one memcpy of the same bytes);
- ``x numpy``: numpy time / kernel time — the speed-up over the numpy
  alternative (``x take``: over ``np.take`` from one stacked window);

and, for the gather, whether the issue's bar is met on the medians (ERA5 and
tiled fields: >= 0.8 x memcpy and >= 3 x numpy; WeatherBench2's tiny rows:
>= 2 x numpy). The same two ratios on the fastest round (``min``) follow: on a
shared machine they show what the code costs when nothing else interferes.
Exits non-zero when a bar is missed, so it can gate CI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# shape-name prefix -> (min fraction of memcpy, min speed-up over numpy fancy indexing)
GATHER_BARS = {"era5": (0.8, 3.0), "wb2": (None, 2.0)}
BASELINE_ROLES = ("memcpy", "numpy", "numpy_take", "gather_with_runs")


def _newest_result() -> Path:
    found = sorted(Path(".benchmarks").glob("*/*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit("no pytest-benchmark JSON under .benchmarks/; pass a file")
    return found[-1]


def _groups(paths: list[Path]) -> dict[str, dict[str, dict]]:
    groups: dict[str, dict[str, dict]] = {}
    for path in paths:
        for bench in json.loads(path.read_text())["benchmarks"]:
            role = bench.get("extra_info", {}).get("role")
            if role and bench.get("group"):
                groups.setdefault(bench["group"], {})[role] = bench
    return groups


def _bar(group: str, vs_memcpy: float | None, vs_numpy: float | None) -> str:
    kind, _, shape = group.partition(" ")
    if kind != "gather":
        return ""
    bars = next((b for prefix, b in GATHER_BARS.items() if shape.startswith(prefix)), None)
    if bars is None:
        return ""
    misses = []
    if bars[0] is not None and (vs_memcpy is None or vs_memcpy < bars[0]):
        misses.append(f"memcpy<{bars[0]}")
    if vs_numpy is None or vs_numpy < bars[1]:
        misses.append(f"numpy<{bars[1]}")
    return "MISS " + ",".join(misses) if misses else "ok"


def report(paths: list[Path]) -> int:
    """Print the table; return how many bars were missed."""
    rows = []
    misses = 0
    for group, roles in sorted(_groups(paths).items()):
        kernel_role = next((r for r in roles if r not in BASELINE_ROLES), None)
        if kernel_role is None:
            continue
        med = {role: b["stats"]["median"] for role, b in roles.items()}
        low = {role: b["stats"]["min"] for role, b in roles.items()}
        kernel = med[kernel_role]
        ratio = {r: (med[r] / kernel if r in med else None) for r in ("memcpy", "numpy", "numpy_take")}
        best = {r: (low[r] / low[kernel_role] if r in low else None) for r in ("memcpy", "numpy")}
        bar = _bar(group, ratio["memcpy"], ratio["numpy"])
        misses += bar.startswith("MISS")
        mb = roles[kernel_role].get("extra_info", {}).get("bytes", 0) / 1e6
        cells = [group, f"{mb:.1f}", f"{kernel * 1e3:.3f}"]
        cells += [
            f"{med[r] * 1e3:.3f}" if r in med else "-" for r in ("memcpy", "numpy", "numpy_take", "gather_with_runs")
        ]
        cells += [f"{ratio[r]:.2f}" if ratio[r] is not None else "-" for r in ("memcpy", "numpy", "numpy_take")]
        cells += [f"{best[r]:.2f}" if best[r] is not None else "-" for r in ("memcpy", "numpy")]
        rows.append(cells + [bar])
    header = [
        "group",
        "MB",
        "kernel ms",
        "memcpy ms",
        "numpy ms",
        "take ms",
        "+runs ms",
        "x memcpy",
        "x numpy",
        "x take",
        "min x memcpy",
        "min x numpy",
        "bar (medians)",
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for cells in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    return misses


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [_newest_result()]
    return 1 if report(paths) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
