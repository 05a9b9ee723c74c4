"""Train a tiny CNN for one epoch on the demo dataset, checkpointing and resuming mid-epoch.

The loader's position is part of the checkpoint (``view.state_dict()``): a
job killed after batch k and restarted from the checkpoint sees exactly the
batches it had not seen, in the same order, and fetches only the chunks
those batches need.

    python examples/train_torch.py                     # writes demo_data/ on first use
    python examples/train_torch.py --stop-after 10     # "crash" after 10 batches (checkpoint saved)
    python examples/train_torch.py --resume            # finish the epoch from the checkpoint
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

try:
    import torch
except ImportError as exc:  # the torch extra
    raise SystemExit("train_torch.py needs PyTorch: pip install 'insitubatch[torch]'") from exc

from insitubatch import InSituDataset, as_torch, obstore_store, open_geometries, split_by_chunk
from insitubatch.tools.demo import DEFAULT_PATH, write_demo_dataset

CHECKPOINT = "demo_data/train_torch.ckpt"
LEAD = 4  # predict t2m four steps (one day) ahead


class TinyCNN(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(channels, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 1, 3, padding=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def normalize(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Device stage: stack inputs as channels and center them (cheap on any device)."""
    x = torch.stack([batch["t2m"], batch["u10"], batch["v10"]], dim=1)
    x = x - x.mean(dim=(2, 3), keepdim=True)
    y = batch["t2m_next"].unsqueeze(1) - batch["t2m"].unsqueeze(1)
    return {"x": x, "y": y}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH)
    parser.add_argument("--checkpoint", default=CHECKPOINT)
    parser.add_argument("--stop-after", type=int, default=None, help="save a checkpoint and exit after N batches")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    store = obstore_store(write_demo_dataset(args.path), read_only=True)
    geoms = open_geometries(store)
    variables = {**geoms, "t2m_next": geoms["t2m"].shift(LEAD)}
    manifest = split_by_chunk(geoms["t2m"], fractions=(0.8, 0.1, 0.1))
    torch.manual_seed(0)
    model = TinyCNN(channels=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with InSituDataset(store, manifest, variables, batch_size=args.batch_size, block_chunks=8) as ds:
        done = 0
        if args.resume:
            ckpt = torch.load(args.checkpoint, weights_only=False)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            ds.train.load_state_dict(json.loads(ckpt["loader"]))
            done = ckpt["loader_batches"]
            print(f"resumed at batch {done} of epoch {ckpt['epoch']}")
        t0, losses = time.perf_counter(), []
        for step, batch in enumerate(as_torch(ds.train, device_transform=normalize), start=done):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if args.stop_after is not None and step + 1 - done >= args.stop_after:
                state = ds.train.state_dict()
                Path(args.checkpoint).parent.mkdir(parents=True, exist_ok=True)
                torch.save(
                    {
                        "model": model.state_dict(),
                        "opt": opt.state_dict(),
                        "loader": json.dumps(state),
                        "loader_batches": state["batches_consumed"],
                        "epoch": state["epoch"],
                    },
                    args.checkpoint,
                )
                print(f"checkpoint after batch {step + 1} -> {args.checkpoint}")
                return 0
        seconds = time.perf_counter() - t0
        print(f"epoch done: {len(losses)} steps in {seconds:.1f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
