"""The ``insitubatch`` command: one subcommand per function pair ``_add_<name>`` / ``_run_<name>``.

To add a subcommand, write ``_add_<name>(subparsers)`` that registers its
arguments and sets ``run=_run_<name>``, and list it in ``_SUBCOMMANDS``.
``python -m insitubatch`` runs the same command line.

A command that fails prints one line, ``insitubatch COMMAND: error: ...``,
and exits with ``EXIT_FAILURE``; a store backend's multi-line debug output
is cut to its first line (the ``traceback`` setting, ``INSITUBATCH_TRACEBACK=1``,
shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from zarr.abc.store import Store

from .. import config
from ..errors import InSituError
from ..progress import progress
from .store_args import URL_HELP, add_store_options, one_line, store_options

__all__ = ["build_parser", "main"]

# Exit status for a command that ran but failed (argparse uses 2 for usage errors).
EXIT_FAILURE = 1


def _add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help=URL_HELP)
    parser.add_argument("--group", default="", help="path of the output group inside the store (default: root)")
    add_store_options(parser, reading=False)


def _open_store(args: argparse.Namespace, *, read_only: bool) -> Store:
    from ..stores.obstore_stores import obstore_store

    return obstore_store(args.url, read_only=read_only, **store_options(args))


def _failures() -> tuple[type[BaseException], ...]:
    """What a command reports in one line: insitubatch's errors, bad values, and store failures."""
    from ..stores.obstore_stores import STORE_FAILURES

    return (InSituError, ValueError, KeyError, TypeError, *STORE_FAILURES)


# -- slots ---------------------------------------------------------------------
def _add_slots(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slots",
        help="print the slot plan (JSON) for an output group",
        description=(
            "Plan chunk- and shard-aligned slot ranges over what is left to write of a group made "
            "by insitubatch.write.create_layout, and print the plan as JSON with each task's environment."
        ),
    )
    _add_store_arguments(parser)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--slot-size", type=int, default=None, help="indices per range (a multiple of the alignment)")
    size.add_argument("--workers", type=int, default=None, help="aim for this many ranges")
    parser.add_argument(
        "--no-resume", dest="resume", action="store_false", help="plan the whole extent, ignoring recorded coverage"
    )
    parser.add_argument("--output", default=None, help="also save the plan to this file")
    parser.set_defaults(run=_run_slots)


def _run_slots(args: argparse.Namespace) -> int:
    from ..write import plan_slots

    store = _open_store(args, read_only=True)
    plan = plan_slots(
        store,
        group=args.group,
        slot_size=args.slot_size,
        workers=args.workers,
        resume=args.resume,
        store_url=args.url,
    )
    if args.output:
        plan.save(args.output)
    print(plan.to_json())
    return 0


# -- write-status --------------------------------------------------------------
def _parse_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range START:STOP") from None
    return lo, hi


def _add_write_status(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "write-status",
        help="show claims, stale claims, completed coverage and remaining ranges of an output group",
    )
    _add_store_arguments(parser)
    parser.add_argument("--clear-stale", action="store_true", help="delete claims whose writer stopped heartbeating")
    parser.add_argument(
        "--clear-coverage",
        type=_parse_range,
        default=None,
        metavar="START:STOP",
        help="forget completed coverage overlapping START:STOP so it is planned and written again",
    )
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.set_defaults(run=_run_write_status)


def _run_write_status(args: argparse.Namespace) -> int:
    from ..write import clear_coverage, clear_stale_claims, write_status

    writes = args.clear_stale or args.clear_coverage is not None
    store = _open_store(args, read_only=not writes)
    notes = []
    # each step lists (and may delete) records in the store: seconds apiece on a remote bucket
    with progress(
        total=1 + bool(args.clear_stale) + (args.clear_coverage is not None), desc="write-status", unit="step"
    ) as bar:
        if args.clear_stale:
            cleared = clear_stale_claims(store, args.group)
            notes.append(
                f"cleared {len(cleared)} stale claim(s): " + ", ".join(f"[{c.start}, {c.stop})" for c in cleared)
            )
            bar.update()
        if args.clear_coverage is not None:
            gone = clear_coverage(store, *args.clear_coverage, group=args.group)
            notes.append(
                f"cleared {len(gone)} coverage record(s): " + ", ".join(f"[{c.start}, {c.stop})" for c in gone)
            )
            bar.update()
        status = write_status(store, args.group)
        bar.update()
    if args.json:
        print(json.dumps({**status.to_dict(), "actions": notes}, indent=2))
        return 0
    for note in notes:
        print(note)
    print(f"group {status.group!r}: extent {status.extent}, alignment {status.alignment}")
    print("completed: " + (", ".join(status.describe(a, b) for a, b in status.completed) or "none"))
    print("remaining: " + (", ".join(status.describe(a, b) for a, b in status.remaining) or "none"))
    print(f"claims: {len(status.claims)} ({len(status.stale_claims)} stale)")
    for claim in status.claims:
        print(f"  {claim.describe(status.now)}")
    if status.stale_claims and not args.clear_stale:
        print("stale claims block their ranges; rerun with --clear-stale to release them")
    return 0


# -- debug-info ----------------------------------------------------------------
def _add_debug_info(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "debug-info",
        help="print versions, built kernels and their flags, CPU count and free-threading state (for bug reports)",
    )
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.set_defaults(run=_run_debug_info)


def _run_debug_info(args: argparse.Namespace) -> int:
    from .debug import debug_info, print_debug_info

    if args.json:
        print(json.dumps(debug_info(), indent=2))
    else:
        print_debug_info()
    return 0


# -- emulate -------------------------------------------------------------------
def _add_emulate(subparsers: Any) -> None:
    from ..testing.emulator import Emulator
    from ..testing.emulator.cli import add_arguments, run

    parser = subparsers.add_parser(
        "emulate",
        help="serve a directory of zarr groups as an emulated object store on 127.0.0.1 until stopped",
        description=(
            "Serve ROOT over HTTP on 127.0.0.1 with an object store's latency, bandwidth and faults, in the "
            "foreground until Ctrl-C or SIGTERM. The first line printed is the base URL; then one line per zarr "
            "group found, with its HTTP URL and the s3:// URL that reads it through the S3 protocol."
        ),
    )
    add_arguments(parser, Emulator)
    parser.set_defaults(run=run)


# -- entry point ---------------------------------------------------------------
def _add_inspect(subparsers: Any) -> None:
    from .inspect_store import add_inspect_parser

    add_inspect_parser(subparsers)


_SUBCOMMANDS: tuple[Callable[[Any], None], ...] = (
    _add_inspect,
    _add_emulate,
    _add_slots,
    _add_write_status,
    _add_debug_info,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``insitubatch`` argument parser with every subcommand registered."""
    from .debug import version_line

    parser = argparse.ArgumentParser(
        prog="insitubatch", description="Tools for insitubatch: zarr archives read in place, written in parallel."
    )
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``insitubatch`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except _failures() as exc:
        if config.get("traceback"):
            raise
        print(f"insitubatch {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
