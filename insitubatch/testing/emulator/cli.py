"""The emulator as a user tool: serve a directory of zarr groups on 127.0.0.1 until stopped.

``python -m insitubatch.testing.emulator ROOT`` (or ``insitubatch emulate
ROOT``) serves ``ROOT`` over HTTP with the link settings given, prints the
base URL as its first line of output, then one line per zarr group it finds
(its HTTP URL, and the ``s3://`` URL with the endpoint that reads it through
the S3 protocol, the first path segment being the bucket), and runs in the
foreground until SIGINT (Ctrl-C) or SIGTERM. On the way out it prints the
requests it served.

Every keyword argument of :class:`~insitubatch.testing.emulator.Emulator`
(handed in by the caller, so this module imports no server) becomes an option of the same name (``latency_s`` is ``--latency-s``), with
its help and default read from the class, so a setting added there appears
here without an edit; ``--set NAME=VALUE`` passes any further link setting
the emulator accepts through ``**``. ``--watch-stdin`` also stops it when
its standard input closes, for a parent that runs it as a child process
(:class:`~insitubatch.testing.emulator.process.EmulatorProcess`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "main", "run"]

PROG = "python -m insitubatch.testing.emulator"
# How deep below the root the startup message looks for groups (bucket/dataset.zarr is 2).
FIND_DEPTH = 2
# Emulator parameters that are not link settings (the root is the positional argument; a script, a TLS
# context and the request log are for a program that runs the emulator in-process).
NOT_OPTIONS = ("self", "root", "script", "tls", "record")


def _parameter_docs(cls: type) -> dict[str, str]:
    """``{name: first sentence}`` from the numpy-style Parameters section of ``cls``'s docstring."""
    doc = inspect.getdoc(cls) or ""
    section = re.search(r"^Parameters\n-+\n(?P<body>.*?)(?=^\S[^\n]*\n-+\n|\Z)", doc, re.M | re.S)
    docs: dict[str, str] = {}
    if section is None:
        return docs
    for m in re.finditer(r"^(?P<names>\*{0,2}\w+(?:, \w+)*)\n(?P<text>(?:    .*\n?)+)", section["body"], re.M):
        text = " ".join(m["text"].split()).replace("``", "").rstrip(".")
        for name in m["names"].lstrip("*").split(", "):
            docs[name] = text
    return docs


def _value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false, null), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _setting(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. tail_s=0.02)")
    return name, _value(value)


def add_arguments(parser: argparse.ArgumentParser, emulator: type) -> argparse.ArgumentParser:
    """Register the options of ``emulator`` (the ``Emulator`` class) on ``parser``: the root, one per keyword, ``--set``.

    Sets ``serve=emulator`` as a default, so :func:`run` starts that class.
    """
    parser.add_argument("root", help="directory to serve: ROOT/a/b is http://HOST:PORT/a/b")
    docs = _parameter_docs(emulator)
    for p in inspect.signature(emulator).parameters.values():
        if p.name in NOT_OPTIONS or p.kind is not p.KEYWORD_ONLY:
            continue
        kind = type(p.default) if isinstance(p.default, (int, float)) and not isinstance(p.default, bool) else _value
        what = docs.get(p.name, f"Emulator's {p.name}")
        parser.add_argument(
            f"--{p.name.replace('_', '-')}",
            dest=p.name,
            type=kind,
            default=p.default,
            help=f"{what} (default: {p.default})",
        )
    parser.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any further link setting the emulator takes, e.g. --set tail_s=0.02 (repeatable; default: none)",
    )
    parser.add_argument(
        "--watch-stdin",
        action="store_true",
        help="also stop when standard input closes (for a parent process that runs it as a child)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the URL (no groups, no request counts)")
    parser.set_defaults(serve=emulator)
    return parser


def build_parser(emulator: type) -> argparse.ArgumentParser:
    """The ``python -m insitubatch.testing.emulator`` parser for the ``Emulator`` class ``emulator``."""
    return add_arguments(
        argparse.ArgumentParser(
            prog=PROG,
            description="Serve a directory of zarr groups as an emulated object store on 127.0.0.1 until stopped.",
        ),
        emulator,
    )


def _is_group(d: Path) -> bool:
    if (d / ".zgroup").is_file():
        return True
    try:
        return json.loads((d / "zarr.json").read_text(encoding="utf-8")).get("node_type") == "group"
    except (OSError, ValueError):
        return False


def _groups(root: Path) -> Iterator[Path]:
    """Zarr groups directly under ``root`` or one level down (a bucket's datasets); never inside a group."""
    level = [root]
    for _ in range(FIND_DEPTH):
        below = sorted(p for d in level for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        yield from (d for d in below if _is_group(d))
        level = [d for d in below if not _is_group(d)]


def _announce(url: str, root: Path, quiet: bool) -> None:
    print(url, flush=True)  # the first line: what a parent process reads
    if quiet:
        return
    for group in _groups(root):
        key = group.relative_to(root).as_posix()
        bucket, _, prefix = key.partition("/")
        line = f"  {url}/{key}"
        if prefix:  # bucket/dataset: the S3 protocol reads it too, path-style
            line += f"    s3://{bucket}/{prefix} with endpoint={url} (or AWS_ENDPOINT_URL={url})"
        print(line, flush=True)
    print("serving until Ctrl-C (SIGINT) or SIGTERM", file=sys.stderr, flush=True)


def _stop_at_eof(stop: threading.Event) -> None:
    sys.stdin.read()  # returns when the parent closes our stdin (or dies)
    stop.set()


def run(args: argparse.Namespace) -> int:
    """Serve as the parsed ``args`` say, until a signal (or, with ``--watch-stdin``, stdin's end)."""
    emulator = args.serve
    root = args.root
    names = [p for p in inspect.signature(emulator).parameters if p not in NOT_OPTIONS]
    options = {name: getattr(args, name) for name in names if hasattr(args, name)}
    options.update(dict(args.settings))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with emulator(root, **options) as emu:
            _announce(emu.url, Path(root), args.quiet)
            if args.watch_stdin:
                threading.Thread(target=_stop_at_eof, args=(stop,), name="emulator-stdin", daemon=True).start()
            while not stop.wait(1.0):  # short waits: the main thread stays responsive to signals
                pass
            s = emu.stats()
        if not args.quiet:
            print(
                f"served {s.requests} requests: {s.gets} GETs, {s.heads} HEADs, {s.bytes_sent} bytes, "
                f"{s.not_found} not found",
                file=sys.stderr,
            )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(emulator: type, argv: Sequence[str] | None = None) -> int:
    """``python -m insitubatch.testing.emulator``: serve until stopped; 1 with a one-line error if it cannot."""
    args = build_parser(emulator).parse_args(argv)
    try:
        return run(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
