"""Fixtures of the wire tests: scripted loopback servers (stopped after each test) and moto checking signatures."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest
from scripted import SHUTDOWN_POLL_S, Request, Scripted, SignedS3, start_signed_s3


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    """``scripted(script)`` or ``scripted(answers=...)`` (``tls=`` a server context): a started server."""
    servers: list[Scripted] = []

    def start(
        script: Callable[[socket.socket, int], None] | None = None,
        *,
        answers: Callable[[Request], bytes | None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> Scripted:
        server = Scripted(script, tls=tls, answers=answers)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def signed_s3() -> Iterator[SignedS3]:
    server = start_signed_s3()
    yield server
    server.stop()


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``AWS_*`` or proxy variable of the machine's changes what a test's stores do."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy") or name == "INSITUBATCH_CLIENT":
            monkeypatch.delenv(name)
