"""Real servers on loopback for tests: moto's standalone S3 server in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
# moto's server takes a few seconds to import on a 2-core machine
S3_START_TIMEOUT_S = 60.0
# moto accepts any credentials; these are what every client in the tests sends
S3_KEY_ID = "testing"
S3_SECRET = "testing"
S3_REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running moto S3 server; ``endpoint`` is ``http://127.0.0.1:<port>``."""

    endpoint: str
    process: subprocess.Popen

    def client_options(self) -> dict[str, object]:
        """Keyword options for ``insitubatch.obstore_store`` / obstore's ``S3Store``."""
        return {
            "endpoint": self.endpoint,
            "allow_http": True,
            "access_key_id": S3_KEY_ID,
            "secret_access_key": S3_SECRET,
            "region": S3_REGION,
        }

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


def start_s3_server() -> S3Server:
    """Start ``moto.server`` on a free loopback port and wait until it answers."""
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY_ID, AWS_SECRET_ACCESS_KEY=S3_SECRET)
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
    return S3Server(endpoint=endpoint, process=proc)
