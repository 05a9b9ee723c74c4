"""``insitubatch slots`` and ``insitubatch write-status``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from write_helpers import ALIGNMENT, EXTENT, GROUP, ManualClock, layout_spec
from zarr.storage import LocalStore

from insitubatch.tools.cli import build_parser, main
from insitubatch.write import SlotPlan, SlotWriter, create_layout

pytest.importorskip("insitubatch.stores.obstore_stores")  # the CLI opens URLs with obstore_store

# A stale claim for the --clear-stale tests: its heartbeat never fires during a test, and
# its claimant's clock ran this far behind, past the staleness threshold.
QUIET_HEARTBEAT_S = 600.0
STALE_AFTER_S = 1200.0
STALE_BY_S = 2 * STALE_AFTER_S


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "o.zarr"
    create_layout(LocalStore(path), layout_spec(), group=GROUP)
    return path


def _stale_claim(path: Path, start: int, stop: int) -> None:
    # the claimant's clock ran behind: its last heartbeat is already older than stale_after_s
    past = ManualClock(time.time() - STALE_BY_S)
    options = {"heartbeat_s": QUIET_HEARTBEAT_S, "stale_after_s": STALE_AFTER_S, "clock": past}
    writer = SlotWriter(LocalStore(path), start, stop, group=GROUP, **options)
    writer.open()
    writer._claim._stop_heartbeat()  # the process "dies": heartbeats stop, the claim stays


def test_slots_prints_the_plan(path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["slots", str(path), "--group", GROUP, "--workers", "2", "--output", str(tmp_path / "p.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["start"], r["stop"]) for r in doc["ranges"]] == [(0, 24), (24, EXTENT)]
    assert doc["ranges"][0]["env"]["INSITUBATCH_STORE"] == str(path)
    assert SlotPlan.load(tmp_path / "p.json").to_dict() == doc


def test_slots_resume_and_no_resume(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SlotWriter(LocalStore(path), 0, ALIGNMENT, group=GROUP):
        pass
    main(["slots", str(path), "--group", GROUP])
    assert len(json.loads(capsys.readouterr().out)["ranges"]) == 3
    main(["slots", str(path), "--group", GROUP, "--no-resume"])
    assert len(json.loads(capsys.readouterr().out)["ranges"]) == 4


def test_slots_bad_slot_size_fails_naming_the_lcm(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slots", str(path), "--group", GROUP, "--slot-size", "6"]) == 1
    assert "multiple of 12" in capsys.readouterr().err


def test_write_status_text(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SlotWriter(LocalStore(path), 0, ALIGNMENT, group=GROUP):
        pass
    _stale_claim(path, 24, 36)
    assert main(["write-status", str(path), "--group", GROUP]) == 0
    out = capsys.readouterr().out
    assert "completed: [0, 12)" in out
    assert "remaining: [12, 44)" in out
    assert "claims: 1 (1 stale)" in out and "[24, 36) claimed by" in out and "--clear-stale" in out


def test_write_status_clear_stale(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _stale_claim(path, 24, 36)
    assert main(["write-status", str(path), "--group", GROUP, "--clear-stale", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["claims"] == [] and doc["actions"] == ["cleared 1 stale claim(s): [24, 36)"]
    with SlotWriter(LocalStore(path), 24, 36, group=GROUP):  # the range is free again
        pass


def test_write_status_clear_coverage(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SlotWriter(LocalStore(path), 0, ALIGNMENT, group=GROUP):
        pass
    assert main(["write-status", str(path), "--group", GROUP, "--clear-coverage", "0:12", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["completed"] == [] and doc["remaining"] == [[0, EXTENT]]


def test_write_status_of_a_group_without_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["write-status", str(tmp_path / "empty")]) == 1
    assert "create_layout" in capsys.readouterr().err


def test_no_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "slots" in capsys.readouterr().err


def test_parser_has_one_function_per_subcommand() -> None:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"slots", "write-status"} <= set(subparsers.choices)


def test_slots_on_s3(
    write_s3_store, s3_server, s3_bucket: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    create_layout(write_s3_store, layout_spec(), group=GROUP)
    options = s3_server.client_options()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret_access_key"])
    monkeypatch.setenv("AWS_REGION", options["region"])
    url = f"s3://{s3_bucket}"
    assert main(["slots", url, "--group", GROUP, "--endpoint", s3_server.endpoint, "--workers", "4"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ranges"]) == 4
