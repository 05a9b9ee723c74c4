"""Runs one measurement in a fresh child process (or in this one), against an emulator or local files, and collects its row.

:class:`Children` is the one child runner of the bench: it hands a JSON
config to :func:`bench.child.main` in a new interpreter (this environment's,
or the arena reference's own, isolated), kills it and its workers on a
timeout, reads the row it prints, and adds the emulator's counters (data
GETs, metadata GETs, bytes on the wire). The arena (``bench.arena.run``)
runs its loaders and ceilings through it; :class:`Bench` is what the
report's loader scenarios (``bench.loader_scenarios``) and the network
scenarios (``bench.network``) measure through, on top of it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from insitubatch.progress import progress
from insitubatch.testing.data import DatasetSpec
from insitubatch.testing.emulator import EmulatorProcess

from .child import RESULT_PREFIX, measure
from .profiles import Profile
from .rows import MB, REPO_ROOT, SPLIT_FRACTIONS, rate
from .split_tiles import data_key_predicate

__all__ = ["Bench", "Children", "one_line"]

# What a child imports before its clock starts, per loader (a training script's imports).
_PRELOAD = {
    "dataloader": ["torch", "zarr", "insitubatch.stores.obstore_stores"],
    "fork_probe": ["torch", "zarr", "insitubatch.stores.obstore_stores"],
    "xbatcher": ["torch", "xarray", "xbatcher", "insitubatch.stores.obstore_stores"],
    "zarr": ["zarr", "insitubatch.stores.obstore_stores"],
    "insitu": ["insitubatch.dataset"],
    "insitu_warm": ["insitubatch.dataset"],
    "insitu_persist": ["insitubatch.dataset"],
    "insitu_steady": ["insitubatch.dataset"],
    "decode_ceiling": ["insitubatch.io.decode"],
    "get_ceiling": ["obstore", "insitubatch.stores.obstore_stores"],
}
# What a row's "config" leaves out: where the data was and how the child was run, not what was measured.
_NOT_SHOWN = (
    "url",
    "local_path",
    "location",
    "variables",
    "preload",
    "peak_rss",
    "emulator_reset_url",
    "rss_exclude_pids",
)


class Children:
    """Runs each measurement's config in a fresh child (or in this process) and turns what it prints into a row."""

    def __init__(self, log_path: Path, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.work = log_path.parent
        self.stderr = log_path.open("w")  # every child's stderr, one header per run

    def close(self) -> None:
        self.stderr.close()

    def run(
        self,
        config: dict[str, Any],
        *,
        title: str,
        python: str | None = None,
        emu: EmulatorProcess | None = None,
        spec: DatasetSpec | None = None,
        in_process: bool = False,
    ) -> dict[str, Any]:
        """Run ``config``'s measurement; its row with ``wall_s`` and, given ``emu``, the emulator's counters.

        ``python`` given: the child runs on that interpreter, isolated (``-I``:
        no ``PYTHONPATH``, no working directory on the path) with this
        repository appended to ``sys.path``, so that interpreter's own
        ``insitubatch`` is the one imported (the arena's reference).
        ``in_process``: no child, :func:`bench.child.measure` here. The
        counters count the GETs of ``spec``'s variables apart from its
        metadata. Never raises: a failed or hung child is a row with ``error``.
        """
        if emu is not None:
            emu.reset_stats()
        t0 = time.perf_counter()
        row = measure(config) if in_process else self._spawn(config, title, python)
        row.setdefault("loader", config["loader"])
        row["wall_s"] = time.perf_counter() - t0
        if emu is not None and spec is not None:
            stats = emu.stats()
            is_data = data_key_predicate(spec.name, spec.variables)
            row.update(
                gets=stats.gets_where(is_data),
                metadata_gets=stats.gets - stats.gets_where(is_data),
                wire_mb=stats.bytes_where(is_data) / MB,
            )
        return row

    def _spawn(self, config: dict[str, Any], title: str, python: str | None) -> dict[str, Any]:
        if python is None:  # this environment, this repository first
            env = dict(
                os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
            )
            cmd = [sys.executable, "-c", "from bench.child import main; main()", json.dumps(config)]
            cwd = REPO_ROOT
        else:  # -I: no PYTHONPATH, no cwd on the path; the repository appended, so that interpreter's package wins
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            boot = f"import sys; sys.path.append({str(REPO_ROOT)!r}); from bench.child import main; main()"
            cmd = [python, "-I", "-c", boot, json.dumps(config)]
            cwd = self.work
        self.stderr.write(f"\n=== {title}\n")
        self.stderr.flush()
        # its own session, so a timeout can end the child and its workers together
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=self.stderr, text=True, start_new_session=True
        )
        try:
            stdout, _ = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"error": f"timed out after {self.timeout_s:.0f} s"}
        for line in reversed(stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                row: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
                return row
        return {"error": f"child exited {proc.returncode} without a result (see children.log)"}


class Bench:
    """Runs children against one emulator and collects their rows."""

    def __init__(
        self,
        profile: Profile,
        out: Path,
        emu: EmulatorProcess,
        data_dir: Path,
        specs: dict[int, DatasetSpec],
        insitu_knobs: dict[str, Any],
        log: Callable[[str], None],
    ) -> None:
        self.profile = profile
        self.out = out
        self.emu = emu
        self.data_dir = data_dir
        self.specs = specs
        self.insitu_knobs = insitu_knobs
        self.log = log
        self.children = Children(out / "children.log", profile.child_timeout_s)
        self.bar = progress(desc="bench", unit="run")  # measurements finished (silent off a terminal)

    def close(self) -> None:
        self.bar.close()
        self.children.close()

    # -- one child ---------------------------------------------------------------------------
    def run(self, spc: int, name: str, loader: str, *, repeats: int = 1, **cfg: Any) -> dict[str, Any]:
        """Run one measurement ``repeats`` times; the row with the median rate, all rates in ``repeat_rates``."""
        rows = [self._run_once(spc, name, loader, **cfg) for _ in range(repeats)]
        self.bar.update(repeats)
        if repeats == 1:
            return rows[0]
        good = sorted((r for r in rows if not r.get("error")), key=rate)
        if not good:
            return rows[0]
        row = good[len(good) // 2]
        row["repeat_rates"] = [rate(r) for r in rows]
        return row

    def _run_once(self, spc: int, name: str, loader: str, **cfg: Any) -> dict[str, Any]:
        """Run one measurement in a child; add the emulator's counters; never raise."""
        spec = self.specs[spc]
        url, local = self.emu.url_for(spec.name), str(self.data_dir / spec.name)
        config = {
            "name": name,
            "loader": loader,
            "url": url,
            "local_path": local,
            "location": {"kind": "http", "url": url, "path": local},
            "variables": list(spec.variables),
            "fractions": list(SPLIT_FRACTIONS),
            "batch_size": self.profile.batch_size,
            "window_s": self.profile.window_s,
            "seed": 0,
            "preload": _PRELOAD[loader],
            "peak_rss": "tree",  # the worker baselines' workers count
            "emulator_reset_url": f"{self.emu.url}/_emulator/reset",
            "rss_exclude_pids": [self.emu.pid],
            **cfg,
        }
        # the fork probe is about child processes: always in one of its own
        in_process = not self.profile.isolate and loader != "fork_probe"
        row = self.children.run(config, title=f"{name} ({url})", emu=self.emu, spec=spec, in_process=in_process)
        row.update(
            spc=spc,
            name=name,
            loader=loader,
            config={k: v for k, v in config.items() if k not in _NOT_SHOWN},
        )
        if row.get("min_gets"):
            row["gets_ratio"] = row["gets"] / row["min_gets"]
        if row.get("elapsed_s"):
            row["wire_mb_per_s"] = row["wire_mb"] / row["elapsed_s"]
        self.log(one_line(row))
        return row

    def insitu(self, spc: int, name: str, *, repeats: int = 1, **extra: Any) -> dict[str, Any]:
        """One insitubatch cold pass (the whole split, no window) with this run's knobs and ``extra``."""
        return self.run(spc, name, "insitu", repeats=repeats, **{**self.insitu_knobs, "window_s": math.inf, **extra})


def one_line(row: dict[str, Any]) -> str:
    """One row as the log line printed as it is measured."""
    if row.get("error"):
        return f"  {row['name']:<24} spc {row['spc']:>2}  ERROR {row['error']}"
    if row["loader"] == "fork_probe":
        return f"  {row['name']:<24} outcome {row.get('outcome')} after {row.get('seconds', math.nan):.1f}s"
    return (
        f"  {row['name']:<24} spc {row['spc']:>2}  {rate(row):>9.1f} samples/s  "
        f"ttfb {row.get('ttfb_s', math.nan):>6.2f}s  rss {row.get('peak_rss_mb', math.nan):>6.0f} MB  "
        f"GETs {row.get('gets', 0):>6}/{row.get('min_gets', '-')}  ({row['wall_s']:.1f}s)"
    )
