"""Runs one measurement in a fresh child process (or in this one) against an emulator, and collects its row.

:class:`Bench` is what the report's loader scenarios (``bench.loader_scenarios``)
and the network scenarios (``bench.network``) both measure through: it hands
a JSON config to ``bench.baselines`` in a new interpreter, kills it on a
timeout, and adds the emulator's counters (data GETs, metadata GETs, bytes
on the wire) to the row the child prints.
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

from .baselines import RESULT_PREFIX, run_config
from .profiles import Profile
from .rows import MB, REPO_ROOT, SPLIT_FRACTIONS, rate
from .split_tiles import data_key_predicate

__all__ = ["Bench", "one_line"]

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
        self.child_log = (out / "children.log").open("w")
        self.bar = progress(desc="bench", unit="run")  # measurements finished (silent off a terminal)

    def close(self) -> None:
        self.bar.close()
        self.child_log.close()

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
        config = {
            "name": name,
            "loader": loader,
            "url": self.emu.url_for(spec.name),
            "local_path": str(self.data_dir / spec.name),
            "variables": list(spec.variables),
            "fractions": list(SPLIT_FRACTIONS),
            "batch_size": self.profile.batch_size,
            "window_s": self.profile.window_s,
            "seed": 0,
            "preload": _PRELOAD[loader],
            "emulator_reset_url": f"{self.emu.url}/_emulator/reset",
            "rss_exclude_pids": [self.emu.pid],
            **cfg,
        }
        timeout = self.profile.child_timeout_s
        self.emu.reset_stats()
        t0 = time.perf_counter()
        row = self._spawn(config, timeout)
        stats = self.emu.stats()
        is_data = data_key_predicate(spec.name, spec.variables)
        row.update(
            spc=spc,
            name=name,
            loader=loader,
            wall_s=time.perf_counter() - t0,
            gets=stats.gets_where(is_data),
            metadata_gets=stats.gets - stats.gets_where(is_data),
            wire_mb=stats.bytes_where(is_data) / MB,
            config={
                k: v
                for k, v in config.items()
                if k not in ("url", "local_path", "variables", "preload", "emulator_reset_url", "rss_exclude_pids")
            },
        )
        if row.get("min_gets"):
            row["gets_ratio"] = row["gets"] / row["min_gets"]
        if row.get("elapsed_s"):
            row["wire_mb_per_s"] = row["wire_mb"] / row["elapsed_s"]
        self.log(one_line(row))
        return row

    def _spawn(self, config: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self.profile.isolate and config["loader"] != "fork_probe":
            return _in_process(config)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-c", "from bench.baselines import main; main()", json.dumps(config)]
        self.child_log.write(f"\n=== {config['name']} ({config['url']})\n")
        self.child_log.flush()
        # its own session, so a timeout can end the child and its workers together
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.child_log,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"error": f"timed out after {timeout:.0f}s"}
        for line in reversed(stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX) :])
        return {"error": f"child exited {proc.returncode} without a result (see children.log)"}

    def insitu(self, spc: int, name: str, *, repeats: int = 1, **extra: Any) -> dict[str, Any]:
        """One insitubatch cold pass (the whole split, no window) with this run's knobs and ``extra``."""
        return self.run(spc, name, "insitu", repeats=repeats, **{**self.insitu_knobs, "window_s": math.inf, **extra})


def _in_process(config: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process (``Profile.isolate`` False)."""
    try:
        for module in config["preload"]:
            __import__(module)
        return run_config(config)
    except Exception as exc:  # a failed loader is a row, not the end of the report
        return {"error": f"{type(exc).__name__}: {exc}"}


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
