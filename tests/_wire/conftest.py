"""Fixtures of the wire tests: emulators with a script (stopped after each test) and moto checking signatures."""

from __future__ import annotations

import gc
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from servers import S3Server, start_s3_server

from insitubatch.testing.emulator import Emulator, Reply, Request

Script = Callable[[Request], "Reply | bytes | None"]


@pytest.fixture
def scripted() -> Iterator[Callable[..., Emulator]]:
    """``scripted(script, root=None, tls=None)``: a started emulator that records every request and connection.

    ``script(request)`` answers each request byte for byte (a ``Reply`` or
    ``bytes``), or ``None`` to let the emulator serve ``root``'s file (a 404
    without a root); ``tls`` is a server context (HTTPS). Each server is
    stopped when the test ends, and must have ended every connection.
    """
    servers: list[Emulator] = []

    def start(script: Script | None = None, *, root: Path | None = None, tls: ssl.SSLContext | None = None) -> Emulator:
        server = Emulator(root, latency_s=0.0, jitter_s=0.0, script=script, tls=tls, record=True)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
    assert all(server.open_connections == 0 for server in servers), "an emulator left a connection open"
    if any(server.root is not None for server in servers):  # a whole pass read files: what it left unclosed
        gc.collect()  # warns in this test, not in a later one (read_through and read_many collect themselves)


@pytest.fixture(scope="session")
def signed_s3() -> Iterator[S3Server]:
    server = start_s3_server(check_signatures=True)
    yield server
    server.stop()


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``AWS_*`` or proxy variable of the machine's changes what a test's stores do."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT":
            monkeypatch.delenv(name)
