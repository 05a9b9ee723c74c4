"""The reference design in the arena: insitubatch 0.2.0 from PyPI, at its defaults, through its public API only.

Runs in a child process of the reference's own virtual environment (Python
>= 3.12, zarr >= 3.3), where ``import insitubatch`` is the reference: the
same package name as ours, so it never shares a process with ours. The
names used are the ones its package exports: ``obstore_store``,
``open_geometries``, ``split_by_chunk``, ``SplitName`` and
``InSituDataset`` (``set_epoch``, ``train``, ``close``). Its store takes
obstore's own options (``client_options``, ``skip_signature``), not ours.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..measure import rss_bytes
from ..rows import MB
from .harness import start, time_passes, train_digest

__all__ = ["REFERENCE_VERSION", "run_reference"]

# The release the issue names: the pure-Python design this project grew from.
REFERENCE_VERSION = "0.2.0"
# The S3 view of the emulator answers any region; obstore wants one named.
EMULATOR_REGION = "us-east-1"


def _reference_store(ib: Any, location: dict[str, Any]) -> Any:
    """The reference's store for an arena location, built with its ``obstore_store`` and obstore's options."""
    kind = location["kind"]
    plain_http = {"allow_http": True}  # the emulator is plain HTTP on loopback
    if kind == "file":
        return ib.obstore_store(Path(location["path"]).resolve().as_uri())
    if kind == "http":
        return ib.obstore_store(location["url"], client_options=plain_http)
    if kind == "s3":
        return ib.obstore_store(
            f"s3://{location['bucket']}",
            endpoint=location["endpoint"],
            skip_signature=True,
            region=EMULATOR_REGION,
            client_options=plain_http,
        )
    raise ValueError(f"location kind={kind!r} must be 'file', 'http' or 's3'")


def _check_is_reference(ib: Any, repo_root: str | None) -> None:
    """Refuse to measure anything but the installed reference (never this repository's package)."""
    where = Path(ib.__file__).resolve()
    if repo_root is not None and (Path(repo_root) / "insitubatch").resolve() in where.parents:
        raise RuntimeError(f"imported insitubatch from {where}, this repository's, not the reference's")
    if ib.__version__ != REFERENCE_VERSION:
        raise RuntimeError(f"the reference is insitubatch {REFERENCE_VERSION}, found {ib.__version__} at {where}")


def run_reference(cfg: dict[str, Any]) -> dict[str, Any]:
    """Time the reference at its defaults (the arena's batch size, which is also its default)."""
    # the reference's package, not ours: imported by name so that nothing (a type checker included)
    # mistakes its API for this repository's
    ib: Any = importlib.import_module("insitubatch")
    _check_is_reference(ib, cfg.get("repo_root"))
    started = start()  # a cold pass counts from here, as ours
    store = _reference_store(ib, cfg["location"])
    geoms = ib.open_geometries(store, list(cfg["variables"]))
    first = next(iter(geoms.values()))
    manifest = ib.split_by_chunk(first, fractions=tuple(cfg["fractions"]))
    train = manifest.sample_indices(ib.SplitName("train"), first)
    base_rss = rss_bytes()  # before the dataset exists, as for ours
    ds = ib.InSituDataset(store, manifest, geoms, batch_size=int(cfg["batch_size"]))

    def open_pass(epoch: int) -> Any:
        ds.set_epoch(epoch)
        return iter(ds.train)

    def close_pass(it: Any) -> None:
        it.close()  # a generator: closing it mid-pass runs its teardown

    window = time_passes(cfg, started, open_pass, len, samples=len(train), close_pass=close_pass)
    ds.close()
    return {
        **window.row(),
        "train_samples": len(train),
        "train_digest": train_digest(train),
        "base_rss_mb": base_rss / MB,
        "reference_version": ib.__version__,
        "max_inflight": ds.scheduler_config.max_inflight,
        "inflight_peak": ds.inflight_peak,
    }
