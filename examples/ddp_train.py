"""Data-parallel training with torchrun: each rank reads only its own chunks.

    torchrun --nproc_per_node=2 examples/ddp_train.py --epochs 2 --cache-dir /local/nvme/era5-cache

The loader takes rank and world size from the initialized process group.
Each epoch's shuffle blocks are dealt across ranks from one seeded order
(no communication), so every chunk is fetched by exactly one rank, and
every rank gets the same number of batches (``last_batch="pad"``), so the
gradient all-reduce never waits on a rank that ran out of data. With
``--cache-dir`` the ranks of a node persist into one directory: each epoch
reshuffles which rank reads which chunk, and a chunk another rank fetched
is revived from disk, so from the second epoch on no rank fetches anything.
"""

from __future__ import annotations

import argparse
import os
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:  # the torch extra
    raise SystemExit("ddp_train.py needs PyTorch: pip install 'insitubatch[torch]'") from exc

from insitubatch import InSituDataset, as_torch, obstore_store, open_geometries, split_by_chunk
from insitubatch.tools.demo import DEFAULT_PATH, write_demo_dataset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cache-dir", help="one persisted cache for every rank of this node (a local disk)")
    args = parser.parse_args(argv)

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if backend == "nccl" else None
    if rank == 0:
        write_demo_dataset(args.path)
    dist.barrier()
    store = obstore_store(args.path, read_only=True)
    geoms = open_geometries(store)
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.9, 0.1, 0.0))
    model = torch.nn.Linear(3, 1)
    if device is not None:
        model = model.to(device)
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    cache = {"cache_dir": args.cache_dir, "persist": True} if args.cache_dir else {}
    with InSituDataset(store, manifest, geoms, batch_size=args.batch_size, block_chunks=4, **cache) as ds:
        for epoch in range(args.epochs):
            ds.set_epoch(epoch)
            t0, samples = time.perf_counter(), 0
            for batch in as_torch(ds.train, device=device):
                x = torch.stack([batch["u10"], batch["v10"], batch["t2m"]], dim=-1).mean(dim=(1, 2))
                loss = (model(x) - 280.0).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                samples += x.shape[0]
            rate = samples / (time.perf_counter() - t0)
            total = torch.tensor([rate], device=device)
            dist.all_reduce(total)
            print(
                f"rank {rank}/{world} epoch {epoch}: {len(ds.train)} batches, {rate:.0f} samples/s, {ds.gets} GETs"
                + (f"; all ranks {total.item():.0f} samples/s" if rank == 0 else ""),
                flush=True,
            )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
