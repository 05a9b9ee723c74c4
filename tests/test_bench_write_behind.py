"""``python -m bench.write_behind`` runs end to end on a small input (the numbers themselves are the bench's)."""

from __future__ import annotations

from pathlib import Path

from bench.write_behind import _table, measure
from insitubatch.tools.demo import write_demo_dataset


def test_write_behind_bench_times_both_kinds_of_pass(tmp_path: Path) -> None:
    data = write_demo_dataset(tmp_path / "input.zarr", shape=(64, 8, 16), chunks=(16, 8, 8))
    result = measure(data, tmp_path, batch_size=16, depth=2, rounds=1)  # raises if the outputs differ
    assert result["batches"] == 4 and result["write_s"] > 0
    assert len(result["sync_s"]) == len(result["behind_s"]) == 1
    assert result["ratio"] > 0 and "synchronous / write-behind" in _table(result)
