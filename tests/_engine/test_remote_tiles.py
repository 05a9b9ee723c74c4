"""A remote pass's whole tiles: read in batches, landed in shared decode jobs, zarr's data in the end."""

from __future__ import annotations

import numpy as np
import zarr

from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk
from insitubatch._engine.tiles.tile_jobs import TileJobs
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator

SHAPE = (96, 12, 16)
CHUNKS = (4, 6, 8)  # 24 sample chunks, each 4 stored tiles


def test_tiles_that_come_together_land_in_one_decode_job_and_read_equal_to_zarr(tmp_path, monkeypatch) -> None:
    data = np.random.default_rng(3).standard_normal(SHAPE).astype("f4")
    zarr.open_group(tmp_path / "a.zarr", mode="w").create_array("v", shape=SHAPE, chunks=CHUNKS, dtype="f4")[:] = data
    jobs: list[int] = []
    landed_job = TileJobs.landed_job

    def counted(self, arrived):
        jobs.append(len(arrived))
        return landed_job(self, arrived)

    monkeypatch.setattr(TileJobs, "landed_job", counted)
    with Emulator(tmp_path, latency_s=0.02, jitter_s=0.0) as emu:
        store = obstore_store(emu.url_for("a.zarr"), read_only=True)
        g = open_geometries(store, variables=["v"])["v"]
        manifest = split_by_chunk(g, fractions=(1.0,))
        with InSituDataset(store, manifest, {"v": g}, batch_size=8, max_inflight=16, seed=1) as ds:
            it = iter(ds.train)
            seen = []
            for batch in it:
                np.testing.assert_array_equal(batch.arrays["v"], data[batch.sample_indices])
                seen.extend(batch.sample_indices.tolist())
            gets = it.stats.gets
        close_store(store)
    assert sorted(seen) == list(range(SHAPE[0]))
    assert sum(jobs) == gets == 24 * 4  # every tile through a landing job, once
    assert max(jobs) >= 2 and len(jobs) < gets  # tiles that came in one loop iteration shared a job
