"""The cache directory's locks between real processes: writers share, readers share, the two exclude each other.

Every refusal names the holders' PIDs, including when two processes start at
the same instant; a SIGKILLed holder frees the directory at once; without
``fcntl`` the package still imports and iterates, and a ``cache_dir`` is
refused naming the platform.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import put_chunk

from insitubatch.cache import LOCK_NAME, SHARED_DIR, DiskCache, network_filesystem, persisted_basename
from insitubatch.cache import lock as lock_mod
from insitubatch.errors import CacheLockedError

FP = "0123456789abcdef"
PATH = "t2m"
SUBPROCESS_TIMEOUT_S = 60
# rounds of two processes taking the lock at the same instant (the issue asks for 20)
RACE_ROUNDS = 20


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _writer(d: Path) -> DiskCache:
    return DiskCache(d, persist=True, fingerprints={PATH: FP})


def _put(c: DiskCache, chunk: int, value: float = 7.0) -> None:
    assert put_chunk(c, PATH, chunk, np.full((4, 5, 4), value, dtype=np.float32))


_OPEN = """
import sys
from insitubatch.cache import DiskCache
from insitubatch.errors import CacheLockedError
try:
    DiskCache(sys.argv[1], persist=True, readonly=sys.argv[2] == "reader", fingerprints={})
except CacheLockedError as exc:
    print("LOCKED", exc)
else:
    print("ACQUIRED")
"""


def test_writers_share_a_directory_and_keep_readers_out_naming_them(tmp_path: Path) -> None:
    with _writer(tmp_path):
        out, err = _spawn(_OPEN, str(tmp_path), "writer").communicate(timeout=SUBPROCESS_TIMEOUT_S)
        assert out.startswith("ACQUIRED"), err  # a second writer shares the directory
        out, err = _spawn(_OPEN, str(tmp_path), "reader").communicate(timeout=SUBPROCESS_TIMEOUT_S)
        assert out.startswith("LOCKED"), err
        assert f"PID {os.getpid()} on host {socket.gethostname()}" in out and "live writer" in out
        with pytest.raises(CacheLockedError, match=f"PID {os.getpid()}"):  # in this process too
            DiskCache(tmp_path, persist=True, readonly=True, fingerprints={})
    assert (tmp_path / LOCK_NAME).exists()


_READER = """
import sys
from insitubatch.cache import DiskCache
with DiskCache(sys.argv[1], persist=True, readonly=True, fingerprints={"t2m": "0123456789abcdef"}) as c:
    print("READY", len(c.entries()), flush=True)
    sys.stdin.read()  # hold the shared lock until the test closes our stdin
print("DONE", flush=True)
"""


def test_readonly_readers_coexist_and_a_writer_names_each_of_them(tmp_path: Path) -> None:
    with _writer(tmp_path) as c:
        _put(c, 0)
    readers = [_spawn(_READER, str(tmp_path)) for _ in range(3)]
    try:
        for r in readers:
            assert r.stdout.readline().split() == ["READY", "1"], r.stderr.read()
        with DiskCache(tmp_path, persist=True, readonly=True, fingerprints={PATH: FP}) as mine:
            assert mine.lookup(PATH, 0, [(4, 5, 4)], np.float32) is not None
        with pytest.raises(CacheLockedError, match="readonly readers") as info:
            _writer(tmp_path)
        for r in readers:
            assert f"PID {r.pid} on host" in str(info.value)
    finally:
        for r in readers:
            out, err = r.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            assert "DONE" in out, err
    with _writer(tmp_path):
        pass


_RACER = """
import json, os, sys
from insitubatch.cache import DiskCache
from insitubatch.errors import CacheLockedError
print("UP", os.getpid(), flush=True)
for line in sys.stdin:
    if line.strip() != "go":
        break
    try:
        cache = DiskCache(sys.argv[1], persist=True, readonly=sys.argv[2] == "reader", fingerprints={})
    except CacheLockedError as exc:
        cache, result = None, {"ok": False, "error": str(exc)}
    else:
        result = {"ok": True}
    print(json.dumps(result), flush=True)
    sys.stdin.readline()  # hold it until both have answered
    if cache is not None:
        cache.close()
    print("released", flush=True)
"""


def _race(tmp_path: Path, modes: tuple[str, str]) -> list[tuple[dict, dict]]:
    """``RACE_ROUNDS`` rounds of two warm processes opening ``tmp_path`` the moment they read "go"."""
    procs = [_spawn(_RACER, str(tmp_path), mode) for mode in modes]
    rounds = []
    try:
        pids = []
        for p in procs:
            word, pid = p.stdout.readline().split()
            assert word == "UP", p.stderr.read()
            pids.append(int(pid))
        for _ in range(RACE_ROUNDS):
            for p in procs:  # back to back: both wake within microseconds of each other
                p.stdin.write("go\n")
                p.stdin.flush()
            results = [json.loads(p.stdout.readline()) for p in procs]
            for p in procs:
                p.stdin.write("release\n")
                p.stdin.flush()
            for p in procs:
                assert p.stdout.readline().strip() == "released"
            rounds.append(tuple({**r, "pid": pid} for r, pid in zip(results, pids)))
    finally:
        for p in procs:  # closes stdin: the racer's loop ends
            _, err = p.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            assert p.returncode == 0, err
    return rounds


def test_the_loser_of_a_same_instant_race_names_the_holder_every_time(tmp_path: Path) -> None:
    _writer(tmp_path).close()
    for first, second in _race(tmp_path, ("writer", "reader")):
        winners = [r for r in (first, second) if r["ok"]]
        assert len(winners) == 1, (first, second)
        (loser,) = [r for r in (first, second) if not r["ok"]]
        assert f"PID {winners[0]['pid']} on host {socket.gethostname()}" in loser["error"], loser["error"]


def test_writers_starting_at_the_same_instant_both_open(tmp_path: Path) -> None:
    for round_ in _race(tmp_path, ("writer", "writer")):
        assert all(r["ok"] for r in round_), round_


_SPILL_ROUNDS = """
import sys
import numpy as np
from insitubatch.cache import DiskCache
tile = np.ones((4, 5, 4), dtype=np.float32)
for _ in range(int(sys.argv[2])):
    with DiskCache(sys.argv[1], persist=False, fingerprints={}) as c:
        h = c.begin("t2m", 0, 1, (4, 5, 4), np.float32)
        c.write(h, 0, tile)
        c.commit(h, [(4, 5, 4)])
print("DONE", flush=True)
"""


def test_spill_writers_coming_and_going_never_lose_the_directory_or_the_gate(tmp_path: Path) -> None:
    """The last spill writer out deletes the lock file and the directory it made, under the gate, while
    another process keeps opening the same directory: every open still finds (or makes) one gate."""
    cache_dir = tmp_path / "spill"
    procs = [_spawn(_SPILL_ROUNDS, str(cache_dir), str(RACE_ROUNDS * 2)) for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        assert proc.returncode == 0 and out.strip() == "DONE", err
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


_KILLED_WRITER = """
import sys
import numpy as np
from insitubatch.cache import DiskCache
c = DiskCache(sys.argv[1], persist=True, fingerprints={"t2m": "0123456789abcdef"})
tile = np.full((4, 5, 4), 7.0, dtype=np.float32)
for chunk in range(3):
    h = c.begin("t2m", chunk, 1, (4, 5, 4), np.float32)
    c.write(h, 0, tile)
    c.commit(h, [(4, 5, 4)])
assert c.find("t2m", 3, [(4, 5, 4)], np.float32).claimed
h = c.begin("t2m", 3, 1, (4, 5, 4), np.float32)  # in flight when the kill lands
c.write(h, 0, tile)
print("READY", flush=True)
sys.stdin.read()
"""


def test_sigkilled_writer_keeps_what_it_finished_and_frees_the_directory(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_NAME
    proc = _spawn(_KILLED_WRITER, str(tmp_path))
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        with pytest.raises(CacheLockedError, match=f"PID {proc.pid}"):
            DiskCache(tmp_path, persist=True, readonly=True, fingerprints={PATH: FP})
        with _writer(tmp_path) as other:  # a live writer's finished chunks are another writer's too
            assert other.find(PATH, 3, [(4, 5, 4)], np.float32).busy  # claimed by the writer making it
            assert other.revived == 0 and other.lookup(PATH, 2, [(4, 5, 4)], np.float32) is not None
            assert other.revived_from_others == 1
        ino = lock.stat().st_ino
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    with _writer(tmp_path) as c:  # re-acquired at once; nothing had to be deleted by hand
        assert set(c.entries()) == {(PATH, i) for i in range(3)}
        for chunk in range(3):
            (tile,) = c.lookup(PATH, chunk, [(4, 5, 4)], np.float32)
            assert (tile == 7.0).all()
        assert c.lookup(PATH, 3, [(4, 5, 4)], np.float32) is None
        assert c.find(PATH, 3, [(4, 5, 4)], np.float32).claimed  # the dead writer's claim is free
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert not list((tmp_path / SHARED_DIR).glob("*.claim"))
    assert not (tmp_path / persisted_basename(PATH, 3, FP)).exists()
    assert lock.stat().st_ino == ino


def test_network_filesystem_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = tmp_path / "mounts"
    root = os.path.realpath(tmp_path)
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        f"server:/export {root} nfs4 rw 0 0\n"
        f"sshfs#me@host: {root}/fuse fuse.sshfs rw 0 0\n"
        f"/dev/vdb {root}/local ext4 rw 0 0\n"
        f"tmpfs {root}/with\\040space tmpfs rw 0 0\n"
    )
    assert network_filesystem(tmp_path / "a", mounts) == "nfs4"
    assert network_filesystem(tmp_path / "fuse" / "x", mounts) == "fuse.sshfs"
    assert network_filesystem(tmp_path / "local", mounts) is None
    assert network_filesystem(tmp_path / "with space", mounts) is None
    monkeypatch.setattr(lock_mod, "_MOUNTS", mounts)
    with pytest.warns(UserWarning, match="nfs4 filesystem") as record:
        DiskCache(tmp_path / "c", persist=True, fingerprints={}).close()
    assert len(record) == 1


_NO_FCNTL = """
import sys
sys.modules["fcntl"] = None  # `import fcntl` now raises ImportError, as on a platform without it
import numpy as np
import zarr
import insitubatch
from insitubatch import InSituDataset, open_geometries, split_by_chunk
from insitubatch.errors import CachePlatformError
store = sys.argv[1]
geoms = open_geometries(store)
manifest = split_by_chunk(geoms["x"], fractions=(1.0,))
truth = zarr.open_array(store, path="x")[:]
with InSituDataset(store, manifest, geoms, batch_size=5, shuffle=False) as ds:
    batches = [b.arrays["x"].copy() for b in ds.train]
np.testing.assert_array_equal(np.concatenate(batches), truth)
try:
    InSituDataset(store, manifest, geoms, cache_dir=sys.argv[2], persist=True)
except CachePlatformError as exc:
    assert sys.platform in str(exc) and "fcntl" in str(exc), exc
    print("REFUSED", exc)
"""


def test_without_fcntl_the_package_imports_and_iterates_and_refuses_a_cache_dir(tmp_path: Path) -> None:
    root = zarr.open_group(tmp_path / "d.zarr", mode="w")
    root.create_array("x", shape=(20, 3), chunks=(4, 3), dtype="f4")[:] = np.arange(60, dtype="f4").reshape(20, 3)
    out = subprocess.run(
        [sys.executable, "-c", _NO_FCNTL, str(tmp_path / "d.zarr"), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED") and "cache_dir=" in out.stdout
    assert not (tmp_path / "cache").exists()  # refused before anything was created
