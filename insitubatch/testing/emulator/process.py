"""The emulator in a child process (``python -m insitubatch.testing.emulator``), driven over HTTP.

The child answers two control endpoints without counting them:
``GET /_emulator/stats`` (JSON) and ``POST /_emulator/reset``, plus
``POST /_emulator/config`` (JSON with any link setting of
:class:`~insitubatch.testing.emulator.link.LinkModel`: ``latency_s``,
``jitter_s``, ``bandwidth_bytes_per_s``, ``tail_s``, ``straggler_share``,
``throttle_share``, ``hold_key``, ...).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .handler import CONTROL_PREFIX, DEFAULT_JITTER_S, DEFAULT_LATENCY_S, STOP_JOIN_S
from .stats import EmulatorStats

__all__ = ["EmulatorProcess"]

# How long EmulatorProcess waits for the child to print its URL.
PROCESS_START_TIMEOUT_S = 30.0


class EmulatorProcess:
    """The same server in a child process; same ``url``/``stats``/``reset_stats``/``configure``.

    Use it when the measured code is CPU-bound in this interpreter, so the
    server's request handling does not compete with it for the GIL.
    Faults are not available across the process boundary.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        latency_s: float = DEFAULT_LATENCY_S,
        jitter_s: float = DEFAULT_JITTER_S,
        bandwidth_bytes_per_s: float | None = None,
        seed: int = 0,
        **link: Any,
    ) -> None:
        self.root = Path(root).resolve()
        cmd = [
            sys.executable,
            "-m",
            "insitubatch.testing.emulator",
            str(self.root),
            "--watch-stdin",  # a parent that dies closes our stdin: the child never outlives it
            "--quiet",
            "--latency-s",
            str(latency_s),
            "--jitter-s",
            str(jitter_s),
            "--seed",
            str(seed),
        ]
        if bandwidth_bytes_per_s is not None:
            cmd += ["--bandwidth-bytes-per-s", str(bandwidth_bytes_per_s)]
        # the tree this package was imported from: one folder up per dot of this module's name
        repo_root = Path(__file__).resolve().parents[__name__.count(".")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.url = self._read_url()
        self.port = int(self.url.rsplit(":", 1)[1])
        self._closed = False
        if link:  # the heavy tail, stragglers, throttling and holds go over the control endpoint
            try:
                self.configure(**link)
            except Exception:
                self.close()
                raise

    def _read_url(self) -> str:
        result: list[str] = []
        stdout = self.process.stdout
        assert stdout is not None  # opened with stdout=PIPE
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(PROCESS_START_TIMEOUT_S)
        line = result[0].strip() if result else ""
        if not line.startswith("http://"):
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"the emulator process did not start (first line {line!r})")
        return line

    @property
    def pid(self) -> int:
        return self.process.pid

    def url_for(self, path: str) -> str:
        return f"{self.url}/{path.lstrip('/')}"

    def _call(self, method: str, action: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(f"{self.url}/{CONTROL_PREFIX}{action}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def stats(self) -> EmulatorStats:
        return EmulatorStats.from_dict(self._call("GET", "stats"))

    def reset_stats(self) -> None:
        self._call("POST", "reset", {})

    def configure(self, **settings: Any) -> dict[str, Any]:
        """Change link settings in the child (any ``Emulator.configure`` keyword); returns them all.

        Raises ``ValueError`` naming the child's complaint for a bad name or value.
        """
        try:
            return self._call("POST", "config", settings)
        except urllib.error.HTTPError as exc:
            raise ValueError(json.loads(exc.read() or b"{}").get("error", str(exc))) from exc

    def close(self) -> None:
        """Stop the child (SIGTERM, its stdin closed too), kill it if it does not exit. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.process.stdin is not None:  # always, with stdin=PIPE
                self.process.stdin.close()
            if self.process.poll() is None:
                self.process.terminate()
            self.process.wait(timeout=STOP_JOIN_S * 2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:  # always, with stdout=PIPE
            self.process.stdout.close()

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
