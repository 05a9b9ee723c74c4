"""Real servers on loopback for tests: the emulator serving a directory, and moto's S3 server.

Every HTTP server the tests run is :class:`insitubatch.testing.emulator.Emulator`
(in-process, in a thread): :func:`serve_files` is it serving a directory
with its requests noted; the wire tests give it a script
(``tests/_wire/conftest.py``). S3 is moto's server in a child process,
started by :func:`start_s3_server` alone, with or without its signature
checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from insitubatch.testing.emulator import Emulator, Request

LOOPBACK = "127.0.0.1"
# moto's server takes a few seconds to import on a 2-core machine
S3_START_TIMEOUT_S = 60.0
# moto accepts any credentials while it checks none; these are what every client in the tests sends
S3_KEY_ID = "testing"
S3_SECRET = "testing"
S3_REGION = "us-east-1"
# With signatures checked, moto lets this many requests through unchecked: the IAM user, its key and its policy.
_UNCHECKED_SETUP_ACTIONS = 3


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running moto S3 server; ``endpoint`` is ``http://127.0.0.1:<port>``.

    ``access_key_id`` / ``secret_access_key`` are the keys its clients sign
    with: the fixed test keys, or, on a server that checks signatures, an
    IAM user's that may do anything.
    """

    endpoint: str
    process: subprocess.Popen
    access_key_id: str = S3_KEY_ID
    secret_access_key: str = S3_SECRET

    def client_options(self, **extra: Any) -> dict[str, Any]:
        """Keyword options for ``insitubatch.obstore_store`` / obstore's ``S3Store`` (``extra`` wins)."""
        return {
            "endpoint": self.endpoint,
            "allow_http": True,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "region": S3_REGION,
            **extra,
        }

    def boto3_client(self) -> Any:
        """A boto3 S3 client signing with this server's keys (to put objects a test then reads)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=S3_REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def reset(self) -> None:
        """Drop every bucket (moto's reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_s3_server(*, check_signatures: bool = False) -> S3Server:
    """Start ``moto.server`` on a free loopback port and wait until it answers.

    A child process, not moto's ``ThreadedMotoServer`` in this one: moto's
    signature switch is process-wide, and a session runs a server of each
    kind at once; its request handling also stays off the tests' GIL.
    With ``check_signatures``, a request whose signature does not verify is
    refused (403), and the server's keys are an IAM user's.
    """
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY_ID, AWS_SECRET_ACCESS_KEY=S3_SECRET)
    if check_signatures:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_UNCHECKED_SETUP_ACTIONS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://{LOOPBACK}:{port}"
    deadline = time.monotonic() + S3_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with code {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1) as resp:
                resp.read()
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server on {endpoint} did not answer within {S3_START_TIMEOUT_S}s") from exc
            time.sleep(0.1)
    server = S3Server(endpoint=endpoint, process=proc)
    if check_signatures:
        try:
            server.access_key_id, server.secret_access_key = _a_user_who_may_do_anything(endpoint)
        except BaseException:
            server.stop()
            raise
    return server


def _a_user_who_may_do_anything(endpoint: str) -> tuple[str, str]:
    """An IAM user on moto at ``endpoint`` with an allow-all policy; its key id and secret."""
    import boto3

    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name=S3_REGION, aws_access_key_id="s", aws_secret_access_key="s"
    )
    iam.create_user(UserName="reader")
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(policy))
    return key["AccessKeyId"], key["SecretAccessKey"]


# --- the emulator serving a directory (stores tests) ---------------------------


@dataclass
class HTTPFileServer:
    """The emulator serving ``root`` read-only (Range, HEAD) at ``url``, no added latency.

    ``requests`` notes ``(method, path, Range header or None)`` for each
    request, in arrival order; a test clears it to count what follows.
    """

    emulator: Emulator
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    @property
    def root(self) -> Path:
        assert self.emulator.root is not None
        return self.emulator.root

    @property
    def url(self) -> str:
        return self.emulator.url


@contextlib.contextmanager
def serve_files(root: Path) -> Iterator[HTTPFileServer]:
    """Serve ``root`` read-only on 127.0.0.1 and a free port until the block ends."""
    notes: list[tuple[str, str, str | None]] = []

    def note(request: Request) -> None:  # the script notes the request and lets the emulator serve it
        notes.append((request.method, request.path, request.headers.get("range")))

    with Emulator(root, latency_s=0.0, jitter_s=0.0, script=note) as emu:
        yield HTTPFileServer(emu, notes)
