"""The command-line options every tool opens a store with, spelled one way across commands.

``insitubatch inspect``, ``insitubatch-check-transform`` and the write
commands all take a URL (or a local path) plus the same ``obstore_store``
options: ``--anonymous`` for unsigned requests, ``--request-payer``,
``--endpoint`` and ``--allow-http``. :func:`add_store_options` registers
them and :func:`store_options` turns parsed arguments back into keyword
arguments; :func:`one_line` is how a tool reports a failure without a
backend's traceback.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["URL_HELP", "add_store_options", "one_line", "store_options"]

URL_HELP = "zarr group URL (s3://, gs://, az://, http(s)://, file://) or a local path"


def add_store_options(parser: argparse.ArgumentParser, *, reading: bool = True) -> None:
    """Register ``--endpoint`` and ``--allow-http``, plus ``--anonymous`` and ``--request-payer`` when ``reading``.

    The write commands sign what they write, so they take neither of the last two.
    """
    if reading:
        parser.add_argument(
            "--anonymous",
            action="store_true",
            help="send unsigned requests, for public buckets (no effect on HTTP or local paths)",
        )
        parser.add_argument(
            "--request-payer",
            nargs="?",
            const=True,
            default=None,
            metavar="PROJECT",
            help="read a requester-pays bucket (S3: the flag alone; GCS: give the billing project)",
        )
    parser.add_argument(
        "--endpoint",
        default=None,
        help="custom object-store endpoint, e.g. http://127.0.0.1:9000 (default: the service's own)",
    )
    parser.add_argument(
        "--allow-http",
        action="store_true",
        default=None,
        help="permit plain-HTTP connections (default: only when the URL or --endpoint is http://)",
    )


def store_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``obstore_store`` keyword arguments the parsed options ask for (only those given)."""
    options: dict[str, Any] = {}
    if getattr(args, "anonymous", False):
        options["anonymous"] = True
    if getattr(args, "request_payer", None) is not None:
        options["requester_pays"] = args.request_payer
    if args.endpoint is not None:
        options["endpoint"] = args.endpoint
    if args.allow_http is not None:
        options["allow_http"] = args.allow_http
    return options


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its message's first line (a backend may append pages of debug output)."""
    text = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).strip()  # KeyError quotes its str
    return text.splitlines()[0] if text else type(exc).__name__
