"""``python -m bench.cache_verify`` runs end to end on a small dataset (the numbers themselves are the bench's)."""

from __future__ import annotations

from pathlib import Path

from bench.cache_verify import _table, measure
from insitubatch.tools.demo import write_demo_dataset


def test_cache_verify_measures_both_kinds_of_warm_epoch(tmp_path: Path) -> None:
    data = write_demo_dataset(tmp_path / "demo.zarr", shape=(160, 8, 16), chunks=(16, 8, 8))
    result = measure(data, tmp_path / "cache", rounds=1, batch_size=16)
    assert result["verified"]["verify"] and not result["unverified"]["verify"]
    assert result["verified"]["gets"] == result["unverified"]["gets"] == 0
    assert result["fill"]["revived"] == 0 and result["verified"]["revived"] == len(
        list((tmp_path / "cache").glob("*.npy"))
    )
    assert result["ratio"] > 0 and "verified / unverified" in _table(result)
