"""The command line as a newcomer meets it: entry points, --version, help on every knob, one-line errors."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import insitubatch
from insitubatch.testing.emulator import Emulator
from insitubatch.tools import check_transform, cli
from insitubatch.tools.demo import write_demo_dataset

ROOT = Path(__file__).resolve().parents[2]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {"insitubatch": cli.build_parser(), "insitubatch-check-transform": check_transform.build_parser()}
    for action in parsers["insitubatch"]._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.update({f"insitubatch {name}": p for name, p in action.choices.items()})
    return parsers


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def plain_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo dataset without consolidated metadata: what an HTTP server cannot list."""
    root = tmp_path_factory.mktemp("cli")
    source = write_demo_dataset(root / "consolidated.zarr")
    target = shutil.copytree(source, root / "site" / "plain.zarr")
    meta = json.loads((target / "zarr.json").read_text())
    meta.pop("consolidated_metadata", None)
    (target / "zarr.json").write_text(json.dumps(meta))
    return target


def test_python_dash_m_and_version(tmp_path: Path) -> None:
    proc = _python("-m", "insitubatch", "--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"insitubatch {insitubatch.__version__}"
    proc = _python("-m", "insitubatch", "debug-info", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["packages"]["insitubatch"] == insitubatch.__version__
    with pytest.raises(SystemExit) as exit_info:
        check_transform.build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0


def test_every_option_has_help_and_says_its_default() -> None:
    missing, silent = [], []
    for command, parser in _parsers().items():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            name = action.option_strings[0] if action.option_strings else action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{command} {name}")
            flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            has_default = action.default not in (None, argparse.SUPPRESS) and not flag and not action.required
            if has_default and action.option_strings and "default" not in (action.help or ""):
                silent.append(f"{command} {name} (default {action.default!r})")
    assert not missing, f"options without help: {missing}"
    assert not silent, f"options whose help does not say their default: {silent}"


def test_unsigned_requests_are_spelled_one_way() -> None:
    readers = ("insitubatch inspect", "insitubatch-check-transform")
    for command, parser in _parsers().items():
        flags = {s for a in parser._actions for s in a.option_strings}
        assert "--skip-signature" not in flags, command
        if command in readers:
            assert {"--anonymous", "--request-payer", "--endpoint", "--allow-http"} <= flags, command


def test_inspect_says_in_one_line_what_an_unlistable_store_needs(
    plain_demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Emulator(plain_demo.parent.parent, latency_s=0.0, jitter_s=0.0) as emu:
        url = emu.url_for(f"site/{plain_demo.name}")
        assert cli.main(["inspect", url, "--no-probe"]) == cli.EXIT_FAILURE
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("insitubatch inspect: error: cannot list the arrays")
        assert "consolidated metadata" in err and "--variables" not in err  # the API's words: variables=[...]
        # named, the variables open without a listing
        assert cli.main(["inspect", url, "--variables", "t2m", "u10", "--no-probe"]) == 0
        assert "t2m" in capsys.readouterr().out
        # a group that is not there: one line as well
        assert cli.main(["inspect", emu.url_for("site/absent.zarr"), "--no-probe"]) == cli.EXIT_FAILURE
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("insitubatch inspect: error:"), err


def test_check_transform_reports_an_unlistable_store_in_one_line(
    plain_demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Emulator(plain_demo.parent.parent, latency_s=0.0, jitter_s=0.0) as emu:
        url = emu.url_for("site/absent.zarr")
        code = check_transform.main([url, "--var", "t2m", "--transform", "numpy:negative", "--no-gil-probe"])
    out = capsys.readouterr().out
    assert code == check_transform.EXIT_FAILED
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL open"), out
    assert "Debug source" not in out


def test_inspect_latency_ceiling_names_the_binding_knob(plain_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["inspect", str(plain_demo), "--no-probe", "--latency-ms", "30"]
    assert cli.main([*args, "--block-chunks", "1", "--max-inflight", "64"]) == 0
    out = capsys.readouterr().out
    ceiling = next(line for line in out.splitlines() if line.startswith("ceiling"))
    assert "the read-ahead (block_chunks=1" in ceiling and "at 30 ms per GET" in ceiling
    assert "raise block_chunks to" in out and "raising max_inflight alone changes nothing" in out
    assert cli.main([*args, "--block-chunks", "4", "--max-inflight", "2"]) == 0
    out = capsys.readouterr().out
    ceiling = next(line for line in out.splitlines() if line.startswith("ceiling"))
    assert "max_inflight=2 GETs in flight" in ceiling
    assert "advice     raise max_inflight to" in out
    # a split shorter than a wide window: no block_chunks helps, and it says so
    assert cli.main([*args, "--block-chunks", "64", "--max-inflight", "4096", "--split", "val"]) == 0
    assert "no block_chunks widens this read-ahead" in capsys.readouterr().out
    assert cli.main([*args, "--latency-ms", "0"]) == cli.EXIT_FAILURE
    assert "latency_ms=0.0 must be > 0" in capsys.readouterr().err
