"""``insitubatch-check-transform``: try a chunk transform on one real chunk before training with it.

Two contracts of a chunk transform only bite at training time: a reshaping
transform must declare ``output_inner(geometry)`` truthfully (the cache sizes
its tiles by it), and the transform must release the GIL (it runs on the
decode pool, where a GIL-holding transform serializes every decode thread).
This command reads one chunk of the real array, runs the transform on it and
checks both, printing one line per check and exiting non-zero if any fails::

    insitubatch-check-transform s3://bucket/era5.zarr --var t2m --transform ./prep.py:Regrid

The GIL probe (``--threads`` threads at once, ``--no-gil-probe`` to skip) is
:mod:`insitubatch.tools.gil_probe`; its docstring says what it measures and
why the threshold sits where it does.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..io.decode import read_stored_chunk
from ..io.geometry import ArrayGeometry
from ..io.group import open_geometries
from ..stores.obstore_stores import obstore_store
from ..transforms import ChunkRead, DecodedChunk, Scoped
from .gil_probe import PROBE_THREADS, gil_probe
from .store_args import URL_HELP, add_store_options, one_line, store_options

__all__ = ["CheckResult", "load_transform", "main", "read_chunk"]

# Exit statuses: every check passed / a check failed or the chunk could not be read.
EXIT_OK = 0
EXIT_FAILED = 1
# Stored chunks of one sample-axis chunk fetched at once.
READ_THREADS = 8
BYTES_PER_MB = 1e6


# -- loading the transform ----------------------------------------------------------
def load_transform(spec: str) -> tuple[Callable[[DecodedChunk], DecodedChunk], str]:
    """Resolve ``module:attr`` or ``path.py:attr`` to a chunk transform and a display name.

    A class is instantiated with no arguments. ``attr`` may be dotted
    (``module:Class.attr``). The current directory is importable, so a
    module next to you is found by name.

    Raises
    ------
    ValueError
        ``spec`` is not ``target:attr``.
    FileNotFoundError
        A ``path.py`` that does not exist.
    ImportError, AttributeError, TypeError
        The module or attribute cannot be loaded; the attribute is not callable;
        a class cannot be built without arguments.
    """
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"--transform {spec!r} must be module:attr or path/to/file.py:attr")
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"--transform {spec!r}: no file {path}")
        module = _module_from_file(path)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(target)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))
            owner = getattr(obj, "__name__", obj)
            raise AttributeError(f"--transform {spec!r}: {owner!r} has no {part!r}; it has {public}")
        obj = getattr(obj, part)
    if inspect.isclass(obj):
        try:
            obj = obj()
        except TypeError as exc:
            raise TypeError(
                f"--transform {spec!r} is a class that cannot be built without arguments ({exc}); "
                "point at a ready instance (module:instance) instead"
            ) from exc
    if not callable(obj):
        raise TypeError(f"--transform {spec!r} is a {type(obj).__name__}, not a callable chunk transform")
    return obj, describe(obj)


def _module_from_file(path: Path) -> Any:
    name = f"_insitubatch_checked_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a class's module up here
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(folder)
    return module


def describe(transform: object) -> str:
    """A short name for a transform: its function or class name, scope included."""
    if isinstance(transform, Scoped):
        return f"applies({list(transform.paths)}, {describe(transform.transform)})"
    return getattr(transform, "__qualname__", None) or type(transform).__qualname__


# -- reading one chunk ------------------------------------------------------------------
def read_chunk(store: Any, geometry: ArrayGeometry, chunk_index: int) -> np.ndarray:
    """Sample-axis chunk ``chunk_index`` assembled from all of its stored chunks, sample axis first."""
    g = geometry
    out = np.empty((g.chunk_len(chunk_index), *g.inner_shape), dtype=g.dtype)

    def place(tile: int) -> None:
        where = g.tile_placement(chunk_index, tile)
        part = read_stored_chunk(store, g, where.chunk_coords)[where.chunk_selection]
        out[where.out_selection] = np.moveaxis(part, g.sample_axis, 0)

    with ThreadPoolExecutor(min(READ_THREADS, g.tiles_per_chunk), thread_name_prefix="check-read") as pool:
        list(pool.map(place, range(g.tiles_per_chunk)))
    return out


# -- checks -----------------------------------------------------------------------------
# A check's outcome, printed first on its line.
CheckStatus = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome."""

    name: str
    status: CheckStatus
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"

    def line(self) -> str:
        return f"{self.status} {self.name:<12} {self.detail}"


def _declared_output(transform: object) -> Callable[[ArrayGeometry], Any] | None:
    inner = transform.transform if isinstance(transform, Scoped) else transform
    fn = getattr(inner, "output_inner", None)
    return fn if callable(fn) else None


def check_scope(transform: object, name: str, path: str) -> CheckResult:
    """The transform would run on ``path`` and, if it validates a scope, accepts it."""
    paths = [path]
    inner = transform
    if isinstance(transform, Scoped):
        if path not in transform.paths:
            scope = list(transform.paths)
            return CheckResult("scope", "FAIL", f"{name} is scoped to {scope}; it would never run on {path!r}")
        paths, inner = list(transform.paths), transform.transform
    validate = getattr(inner, "validate_scope", None)
    if callable(validate):
        try:
            validate(paths)
        except Exception as exc:  # a transform's own validation, whatever it raises
            return CheckResult("scope", "FAIL", f"{name}.validate_scope({paths}) refused: {exc}")
        return CheckResult("scope", "PASS", f"{name} runs on {path!r} and accepts the scope {paths}")
    return CheckResult("scope", "PASS", f"{name} runs on {path!r}")


def check_output(transform: object, name: str, geometry: ArrayGeometry, n_in: int, out: object) -> list[CheckResult]:
    """The returned object, the sample axis, and ``output_inner`` (declared or not) against the real output."""
    if not isinstance(out, DecodedChunk):
        got = type(out).__name__
        return [CheckResult("returns", "FAIL", f"{name} returned {got}; a chunk transform returns a DecodedChunk")]
    data = out.data
    if not isinstance(data, np.ndarray):
        got = type(data).__name__
        return [CheckResult("returns", "FAIL", f"{name} returned a DecodedChunk holding {got}, not a numpy array")]
    results = [CheckResult("returns", "PASS", f"a DecodedChunk holding {data.shape} {data.dtype}")]
    if data.ndim == 0 or data.shape[0] != n_in:
        got = "a 0-d array" if data.ndim == 0 else f"{data.shape[0]} samples (shape {data.shape})"
        results.append(
            CheckResult(
                "sample-axis",
                "FAIL",
                f"{name} turned {n_in} samples into {got}; axis 0 is the sample axis and must keep its length",
            )
        )
        return results
    results.append(CheckResult("sample-axis", "PASS", f"{n_in} samples in, {n_in} out"))
    inner, dtype = tuple(data.shape[1:]), data.dtype
    declared_fn = _declared_output(transform)
    if declared_fn is None:
        if inner == tuple(geometry.inner_shape) and dtype == geometry.dtype:
            results.append(CheckResult("output-inner", "PASS", f"inner {inner} {dtype} kept; no output_inner needed"))
        else:
            results.append(
                CheckResult(
                    "output-inner",
                    "FAIL",
                    f"{name} changed inner {tuple(geometry.inner_shape)} {geometry.dtype} to {inner} {dtype} without "
                    "declaring output_inner(geometry) -> (inner_shape, dtype); declare it so the cache can size its tiles",
                )
            )
        return results
    try:
        declared_shape, declared_dtype = declared_fn(geometry)
        declared_shape = tuple(int(s) for s in declared_shape)
        declared_dtype = np.dtype(declared_dtype)
    except Exception as exc:  # whatever the user's output_inner raises or returns
        results.append(
            CheckResult(
                "output-inner",
                "FAIL",
                f"{name}.output_inner(geometry) failed or returned no (inner_shape, dtype): {exc!r}",
            )
        )
        return results
    if (declared_shape, declared_dtype) != (inner, dtype):
        results.append(
            CheckResult(
                "output-inner",
                "FAIL",
                f"{name}.output_inner declares inner {declared_shape} {declared_dtype} but the transform returned "
                f"{inner} {dtype}; the cache would size its tiles wrong",
            )
        )
    else:
        detail = f"declared {declared_shape} {declared_dtype} matches the output"
        results.append(CheckResult("output-inner", "PASS", detail))
    return results


def check_gil(transform: Callable[[DecodedChunk], object], name: str, chunk: DecodedChunk, threads: int) -> CheckResult:
    """Run the GIL probe and turn its measurement into a one-line verdict."""
    try:
        probe = gil_probe(transform, chunk, threads=threads)
    except RuntimeError as exc:
        return CheckResult("gil-probe", "FAIL", f"{name}: {exc}")
    if probe is None:
        return CheckResult(
            "gil-probe",
            "SKIP",
            "no scheduler accounting and one usable core, or threads never got a core: scaling cannot be measured",
        )
    how = (
        f"{probe.describe()}; flag below {probe.threshold:.2f}; {probe.samples} samples per call, "
        f"{probe.call_s * 1e3:.1f} ms"
    )
    if probe.holds_gil:
        return CheckResult(
            "gil-probe",
            "FAIL",
            f"{name} holds the GIL: {how}; it would serialize the decode pool — vectorize it with numpy "
            "(no per-element Python) or move it to a batch_transform",
        )
    return CheckResult("gil-probe", "PASS", f"{name} releases the GIL: {how}")


# -- command line -----------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from .debug import version_line

    parser = argparse.ArgumentParser(
        prog="insitubatch-check-transform",
        description="Run a chunk transform on one real chunk and check its output_inner and that it releases the GIL.",
    )
    parser.add_argument("url", help=URL_HELP)
    parser.add_argument("--var", required=True, help="zarr array path to read a chunk of")
    parser.add_argument(
        "--transform",
        required=True,
        help="module:attr or path/to/file.py:attr (a class is instantiated with no arguments)",
    )
    parser.add_argument("--group", default="", help="group inside the store holding --var (default: root)")
    parser.add_argument("--sample-axis", type=int, default=0, help="the array's sample axis (default: 0)")
    parser.add_argument("--chunk", type=int, default=0, help="sample-axis chunk index to read (default: 0)")
    parser.add_argument("--no-gil-probe", dest="gil_probe", action="store_false", help="skip the thread-scaling probe")
    parser.add_argument(
        "--threads", type=int, default=PROBE_THREADS, help=f"threads the probe runs at once (default: {PROBE_THREADS})"
    )
    add_store_options(parser)
    parser.add_argument("--version", action="version", version=version_line())
    return parser


def _open_store(args: argparse.Namespace) -> Any:
    return obstore_store(args.url, read_only=True, **store_options(args))


def _mb(nbytes: float) -> str:
    return f"{nbytes / BYTES_PER_MB:.3f} MB"


def _print_geometry(g: ArrayGeometry) -> None:
    print(f"array        {g.path!r}  shape {g.shape} {g.dtype}, sample axis {g.sample_axis} ({g.n_samples} samples)")
    print(
        f"chunking     stored chunk {g.stored_chunks}: {g.sample_chunk_size} samples per chunk, {g.n_chunks} chunks, "
        f"{g.tiles_per_chunk} stored chunk(s) per sample-axis chunk"
    )
    print(f"decoded      {_mb(g.chunk_nbytes)} per chunk (inner {g.inner_shape} {g.dtype})")


def _verdict(results: Sequence[CheckResult]) -> int:
    failed = [r.name for r in results if r.failed]
    ran = [r for r in results if r.status != "SKIP"]
    if failed:
        print(f"verdict      FAIL: {len(failed)} of {len(ran)} checks failed ({', '.join(failed)})")
        return EXIT_FAILED
    print(f"verdict      PASS: {len(ran)} checks passed")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; return 0 when every check passes, 1 otherwise (2 for bad arguments)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return int(exc.code or 0)
    if args.threads < 2:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: --threads={args.threads} must be >= 2", file=sys.stderr)
        return 2

    try:
        transform, name = load_transform(args.transform)
    except Exception as exc:  # anything importing user code can raise
        print(f"FAIL {'load':<12} {one_line(exc)}")
        return EXIT_FAILED
    print(f"transform    {name}  (from {args.transform})")
    try:
        store = _open_store(args)
        found = open_geometries(store, variables=[args.var], sample_axis=args.sample_axis, group=args.group)
        (geometry,) = found.values()
    except Exception as exc:  # store, metadata and argument errors alike: one line, never a backend's traceback
        print(f"FAIL {'open':<12} {args.url} --var {args.var}: {one_line(exc)}")
        return EXIT_FAILED
    _print_geometry(geometry)

    results: list[CheckResult] = []

    def report(result: CheckResult) -> None:
        results.append(result)
        print(result.line())

    report(check_scope(transform, name, geometry.path))
    try:
        t0 = time.perf_counter()
        data = read_chunk(store, geometry, args.chunk)
        read_s = time.perf_counter() - t0
    except Exception as exc:  # chunk out of range, store or decode failure
        report(CheckResult("read", "FAIL", f"chunk {args.chunk} of {geometry.path!r}: {one_line(exc)}"))
        return _verdict(results)
    tiles = geometry.tiles_per_chunk
    print(f"read         chunk {args.chunk}: {data.shape} from {tiles} stored chunk(s) in {read_s * 1e3:.1f} ms")
    # like the engine, hand the transform a writable chunk of its own (it may write in place)
    chunk = DecodedChunk(ChunkRead(geometry.path, args.chunk), data, args.chunk * geometry.sample_chunk_size)
    try:
        t0 = time.perf_counter()
        out = transform(DecodedChunk(chunk.read, data.copy(), chunk.sample_offset))
        run_s = time.perf_counter() - t0
    except Exception as exc:  # the user's transform, whatever it raises
        report(CheckResult("run", "FAIL", f"{name} raised {type(exc).__name__}: {exc}"))
        return _verdict(results)
    report(CheckResult("run", "PASS", f"{name} ran on the chunk in {run_s * 1e3:.2f} ms"))
    for result in check_output(transform, name, geometry, data.shape[0], out):
        report(result)
    if isinstance(out, DecodedChunk) and isinstance(out.data, np.ndarray) and out.data.ndim:
        per_chunk = out.data.nbytes / out.data.shape[0] * geometry.sample_chunk_size
        inner = f"inner {out.data.shape[1:]} {out.data.dtype}"
        print(f"cache        {_mb(per_chunk)} per chunk after the transform ({inner})")
    key = getattr(transform, "cache_key", None)
    print(
        f"cache key    {key!r}"
        if key is not None
        else "cache key    none: a persistent cache fingerprints it by cloudpickle, else by source hash"
    )
    if not args.gil_probe:
        report(CheckResult("gil-probe", "SKIP", "--no-gil-probe"))
    elif not any(r.failed for r in results):
        report(check_gil(transform, name, chunk, args.threads))
    else:
        report(CheckResult("gil-probe", "SKIP", "an earlier check failed"))
    return _verdict(results)


if __name__ == "__main__":
    raise SystemExit(main())
