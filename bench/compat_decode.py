"""insitubatch's per-codec decode chain against zarr's own synchronous chain (zarr >= 3.3).

zarr 3.3 added ``zarr.core.chunk_utils.ChunkTransform``, a synchronous
decode of one chunk through its codec list. ``insitubatch/_zarr_compat.py``
would use it if it were faster than calling each codec's decode directly
(which insitubatch needs anyway, to check blosc frames and shard indexes
between stages). This prints both per chunk, for a few real codec lists::

    python -m bench.compat_decode [--repeat N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.buffer.cpu import Buffer as CpuBuffer
from zarr.buffer.cpu import numpy_buffer_prototype
from zarr.codecs import BloscCodec, GzipCodec, TransposeCodec, ZstdCodec

from insitubatch._zarr_compat import ArrayConfig, chunk_spec, sync
from insitubatch.io.arrays import geometry_of
from insitubatch.io.decode import make_decoder

# Chunk shapes: the demo's (8 steps of a 32x64 grid, 64 KB) and a 1 MB cube,
# the two ends of what the engine decodes per stored chunk.
SHAPES = {"64KB": (8, 32, 64), "1MB": (64, 64, 64)}
CHAINS: dict[str, dict[str, Any]] = {
    "bytes+zstd": dict(compressors=ZstdCodec(level=3)),
    "bytes+blosc-lz4": dict(compressors=BloscCodec(cname="lz4")),
    "transpose+bytes+gzip": dict(filters=TransposeCodec(order=(2, 1, 0)), compressors=GzipCodec(level=1)),
}
# Best of this many timed rounds of LOOPS decodes each (the minimum is the least noisy on a shared box).
REPEAT = 5
LOOPS = 20


def _time(fn: Any, raw: Any) -> float:
    t0 = time.perf_counter()
    for _ in range(LOOPS):
        fn(raw)
    return (time.perf_counter() - t0) / LOOPS


def _best_pair(a: Any, b: Any | None, raw: Any, repeat: int) -> tuple[float, float]:
    """Best seconds per call of ``a`` and ``b``, timed in alternating rounds so load hits both alike."""
    best_a = best_b = float("inf")
    for _ in range(repeat):
        best_a = min(best_a, _time(a, raw))
        if b is not None:
            best_b = min(best_b, _time(b, raw))
    return best_a, best_b


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=REPEAT, help="timed loops per case (best is reported)")
    args = parser.parse_args(argv)
    try:
        from zarr.core.chunk_utils import ChunkTransform, evolve_codecs
    except ImportError:
        ChunkTransform = None  # zarr < 3.3
    print(f"zarr {zarr.__version__}; microseconds per chunk decode, best of {args.repeat}x{LOOPS}")
    print(f"{'chain':24} {'chunk':>6} {'insitubatch':>12} {'zarr sync':>12} {'zarr/insitubatch':>17}")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for chain, kwargs in CHAINS.items():
            for label, shape in SHAPES.items():
                path = Path(tmp) / f"{chain}-{label}.zarr"
                arr = zarr.create_array(path, shape=shape, chunks=shape, dtype="f4", **kwargs)
                arr[:] = np.cumsum(rng.standard_normal(shape, dtype="f4"), axis=-1)  # compressible, like a field
                key = "c/0/0/0"
                raw = sync(arr.store.get(key, prototype=numpy_buffer_prototype())).as_numpy_array()
                decoder = make_decoder(geometry_of(arr))
                ours_fn = lambda r, decoder=decoder: decoder(r, (0, 0, 0))  # noqa: E731
                theirs_fn = None
                if ChunkTransform is not None:
                    spec = chunk_spec(
                        arr.metadata, shape, ArrayConfig(order="C", write_empty_chunks=False), numpy_buffer_prototype()
                    )
                    transform = ChunkTransform(codecs=evolve_codecs(arr.metadata.codecs, spec))

                    def theirs_fn(
                        r: Any, transform: Any = transform, spec: Any = spec
                    ) -> np.ndarray:  # the decoder's contract: full shape, C order
                        return np.ascontiguousarray(
                            transform.decode_chunk(CpuBuffer.from_array_like(r), spec).as_numpy_array()
                        )

                    np.testing.assert_array_equal(theirs_fn(raw), ours_fn(raw))
                ours, theirs = _best_pair(ours_fn, theirs_fn, raw, args.repeat)
                theirs_text, ratio = "n/a", "n/a"
                if theirs_fn is not None:
                    theirs_text, ratio = f"{theirs * 1e6:12.1f}", f"{theirs / ours:17.2f}"
                print(f"{chain:24} {label:>6} {ours * 1e6:12.1f} {theirs_text:>12} {ratio:>17}")


if __name__ == "__main__":
    main()
