"""The ``insitubatch`` command: one subcommand per function pair ``_add_<name>`` / ``_run_<name>``.

To add a subcommand, write ``_add_<name>(subparsers)`` that registers its
arguments and sets ``run=_run_<name>``, and list it in ``_SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from zarr.abc.store import Store

from ..errors import InSituError
from ..progress import progress

__all__ = ["build_parser", "main"]

# Exit status for a command that ran but failed (argparse uses 2 for usage errors).
EXIT_FAILURE = 1


def _add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="store URL (s3://bucket/prefix, gs://..., file://...) or a local path")
    parser.add_argument("--group", default="", help="path of the output group inside the store (default: root)")
    parser.add_argument("--endpoint", default=None, help="custom object-store endpoint, e.g. http://127.0.0.1:9000")
    parser.add_argument("--allow-http", action="store_true", default=None, help="permit plain-HTTP connections")


def _open_store(args: argparse.Namespace, *, read_only: bool) -> Store:
    from ..io.stores import obstore_store

    options: dict[str, Any] = {}
    if args.endpoint is not None:
        options["endpoint"] = args.endpoint
    if args.allow_http is not None:
        options["allow_http"] = args.allow_http
    return obstore_store(args.url, read_only=read_only, **options)


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


# -- entry point ---------------------------------------------------------------
def _add_inspect(subparsers: Any) -> None:
    from .inspect_store import add_inspect_parser

    add_inspect_parser(subparsers)


_SUBCOMMANDS: tuple[Callable[[Any], None], ...] = (_add_inspect, _add_slots, _add_write_status, _add_debug_info)


def build_parser() -> argparse.ArgumentParser:
    """The ``insitubatch`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="insitubatch", description="Tools for insitubatch: zarr archives read in place, written in parallel."
    )
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
    except (InSituError, ValueError, KeyError, FileNotFoundError) as exc:
        print(f"insitubatch {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
