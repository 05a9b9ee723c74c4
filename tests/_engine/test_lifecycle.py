"""A script exits however it ends, and a finalizer never starts a thread, a loop or I/O.

Each ending pattern runs as a real script in a subprocess, over a local
directory and over the loopback emulator (HTTP, the engine's own client):
the script prints its last line, and the process must be gone moments
later with the exit code that ending gives.
"""

from __future__ import annotations

import _thread
import ast
import asyncio
import contextlib
import functools
import gc
import importlib.util
import operator
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

import insitubatch as ib
from insitubatch._engine import lifecycle
from insitubatch._weak import WeakMembers

# Seconds from a script's last line to its exit: far above a prompt exit (well under one second), far
# below the hang this guards against (forever). A loaded 2-core CI machine starts Python slowly, which
# happens before the last line and does not count.
EXIT_WITHIN_S = 10.0
# Whole-script ceiling (start-up, imports, the pass itself, the exit).
SCRIPT_TIMEOUT_S = 120.0

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import insitubatch as ib

    url, pattern = sys.argv[1], sys.argv[2]


    def make():
        store = ib.obstore_store(url, read_only=True)
        geoms = ib.open_geometries(store, variables=["a", "b"])
        manifest = ib.split_by_chunk(geoms["a"], fractions=(0.5, 0.5))
        return ib.InSituDataset(store, manifest, geoms, batch_size=4, block_chunks=2)


    def last_line():
        print(f"LAST {time.time()!r}", flush=True)


    if pattern == "function-unclosed":
        def main():
            ds = make()
            for _ in ds.train:
                pass
        main()
    elif pattern == "break-in-function":
        def main():
            ds = make()
            for i, _ in enumerate(ds.train):
                if i == 1:
                    break
        main()
    elif pattern == "zipped-views":
        def main():
            ds = make()
            for _ in zip(ds.train, ds.val):
                pass
        main()
    elif pattern == "temporary-dataset":
        for _ in make().train:
            pass
    elif pattern == "open-iterator":
        ds = make()
        it = iter(ds.train)
        next(it)
    elif pattern == "module-global":
        ds = make()
        for i, _ in enumerate(ds.train):
            if i == 1:
                break
    elif pattern == "with-block":
        with make() as ds:
            for _ in ds.train:
                pass
    elif pattern == "torch-break":
        def main():
            ds = make()
            for i, _ in enumerate(ib.as_torch(ds.train)):
                if i == 1:
                    break
        main()
    elif pattern == "sys-exit":
        ds = make()
        for i, _ in enumerate(ds.train):
            if i == 1:
                last_line()
                sys.exit(3)
    elif pattern == "uncaught-exception":
        ds = make()
        for i, _ in enumerate(ds.train):
            if i == 1:
                last_line()
                raise RuntimeError("the training step failed")
    elif pattern == "keyboard-interrupt":
        ds = make()
        for i, _ in enumerate(ds.train):
            if i == 1:
                last_line()
                raise KeyboardInterrupt
    elif pattern == "ctrl-c":
        ds = make()
        print("READY", flush=True)
        while True:  # epochs until the signal lands, wherever the main thread waits
            for _ in ds.train:
                pass
    last_line()
    """
)

# pattern -> the exit code its ending gives (an uncaught KeyboardInterrupt ends the process by SIGINT)
PATTERNS = {
    "function-unclosed": 0,
    "break-in-function": 0,
    "zipped-views": 0,
    "temporary-dataset": 0,
    "open-iterator": 0,
    "module-global": 0,
    "with-block": 0,
    "torch-break": 0,
    "sys-exit": 3,
    "uncaught-exception": 1,
    "keyboard-interrupt": -signal.SIGINT,
    "ctrl-c": -signal.SIGINT,
}
# how long another thread holds the pool's lock while a collector finalizes a pass
LOCK_HELD_S = 4.0
# run together, a few at a time: each is mostly start-up and waiting
AT_ONCE = 4


def _write_store(root: Path) -> Path:
    path = root / "d.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=2)  # consolidated metadata is v2's own
    for name in ("a", "b"):
        array = group.create_array(name, shape=(64, 12, 10), chunks=(8, 6, 10), dtype="f4")
        array[...] = np.arange(64 * 120, dtype="f4").reshape(64, 12, 10)
    zarr.consolidate_metadata(path)
    return path


@pytest.fixture(params=["local", "emulator"])
def store_url(request, tmp_path: Path) -> str:
    if request.param == "local":
        return str(_write_store(tmp_path))
    emulator = request.getfixturevalue("emulator")
    _write_store(emulator.root)
    return emulator.url_for("d.zarr")


@contextlib.contextmanager
def _sigint_raises() -> Iterator[None]:
    """While it holds, SIGINT raises KeyboardInterrupt here, and a child started here gets it at its default.

    A test run launched in the background of a non-interactive shell (``cmd &``) inherits SIGINT
    ignored, and so would every child: Python then installs no handler, and the SIGINT the ctrl-c
    ending sends does nothing. A caught signal is reset to its default by exec, so the parent
    catches it meanwhile. (No ``preexec_fn``: it runs the parent's at-fork hooks, and JAX's warns.)
    """
    before = signal.getsignal(signal.SIGINT)
    if before is signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _finish(proc: subprocess.Popen, pattern: str) -> tuple[int, float, str]:
    """Wait for ``proc``; its exit code, seconds from its last line to its exit, and its stderr."""
    try:
        out, err = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{pattern}: still running after {SCRIPT_TIMEOUT_S}s (hung at exit?)\n{out}\n{err}")
    ended = time.time()
    stamps = [float(line.split()[1]) for line in out.splitlines() if line.startswith("LAST ")]
    assert stamps, f"{pattern}: never reached its last line\nstdout: {out}\nstderr: {err}"
    return proc.returncode, ended - stamps[-1], err


@pytest.mark.slow
def test_every_ending_of_a_script_exits_promptly(store_url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}  # zarr's consolidated-metadata notice is not the point
    # a leg without torch runs every other ending (the torch one is the same ending through the adapter)
    names = [p for p in PATTERNS if p != "torch-break" or importlib.util.find_spec("torch") is not None]
    for i in range(0, len(names), AT_ONCE):
        procs = {}
        with _sigint_raises():
            for pattern in names[i : i + AT_ONCE]:
                procs[pattern] = subprocess.Popen(
                    [sys.executable, str(script), store_url, pattern],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
        if "ctrl-c" in procs:  # a real SIGINT, from outside, while the main thread waits inside a pass
            proc = procs["ctrl-c"]
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "READY"
            time.sleep(0.5)
            stamp = time.time()
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=SCRIPT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                pytest.fail("ctrl-c: still running after SIGINT")
            assert proc.returncode == PATTERNS["ctrl-c"], err
            assert time.time() - stamp < EXIT_WITHIN_S
            procs.pop("ctrl-c")
        for pattern, proc in procs.items():
            code, after_last, err = _finish(proc, pattern)
            assert code == PATTERNS[pattern], f"{pattern}: exit code {code}\n{err}"
            assert after_last < EXIT_WITHIN_S, f"{pattern}: exited {after_last:.1f}s after its last line"
            if code == 0:
                assert "Traceback" not in err and "Exception ignored" not in err, f"{pattern}:\n{err}"


# --- finalizers ------------------------------------------------------------------------------


def _dataset(path: Path, **knobs) -> ib.InSituDataset:
    geoms = ib.open_geometries(str(path), variables=["a", "b"])
    manifest = ib.split_by_chunk(geoms["a"], fractions=(1.0,))
    return ib.InSituDataset(str(path), manifest, geoms, batch_size=4, block_chunks=2, **knobs)


class _Trap:
    """Records every thread started and every request for zarr's loop while armed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import zarr.core.sync as zsync

        self.calls: list[str] = []
        self.armed = False
        start, get_loop = threading.Thread.start, zsync._get_loop

        def trapped_start(thread: threading.Thread) -> None:
            if self.armed:
                self.calls.append(f"Thread.start({thread.name})")
            start(thread)

        def trapped_get_loop():
            if self.armed:
                self.calls.append("zarr _get_loop()")
            return get_loop()

        monkeypatch.setattr(threading.Thread, "start", trapped_start)
        monkeypatch.setattr(zsync, "_get_loop", trapped_get_loop)


def test_a_pass_found_by_the_collector_is_signalled_and_starts_nothing(tmp_path: Path, monkeypatch) -> None:
    """An iterator dropped inside a cycle is finalized by the collector: released without a thread, a loop
    request or a wait (the collector may run in any thread, with any lock held)."""
    path = _write_store(tmp_path)
    trap = _Trap(monkeypatch)
    ds = _dataset(path)
    it = iter(ds.train)
    next(it)
    pool, producer, state = ds.pool, it._state.thread, weakref.ref(it._state)
    trainer = {"batches": it}
    trainer["self"] = trainer  # an object graph with a cycle, as a trainer object often is
    del ds, it, trainer
    held, release = threading.Event(), threading.Event()

    def hold_the_pool() -> None:  # another thread in the pool's lock while the collector runs
        with pool.cond:
            held.set()
            release.wait(LOCK_HELD_S)

    holder = threading.Thread(target=hold_the_pool)
    holder.start()
    held.wait()
    trap.armed = True
    t0 = time.monotonic()
    gc.collect()
    took = time.monotonic() - t0
    trap.armed = False
    release.set()
    holder.join()
    assert trap.calls == []
    assert took < LOCK_HELD_S / 2  # the finalizer waited for nothing (a close waits for the pool's lock)
    deadline = time.monotonic() + 10
    while (producer.is_alive() or pool._owners) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not producer.is_alive()  # it saw the stop on its own
    assert not pool._owners  # the loop ended the driver and handed the entries back
    gc.collect()
    assert state() is None  # nothing keeps the finished pass alive


def test_breaking_out_stops_the_pass_before_the_next_line(tmp_path: Path) -> None:
    """A reference the caller drops (``break``) still closes in full, at once: nothing left running."""
    path = _write_store(tmp_path)
    with _dataset(path) as ds:
        for _ in ds.train:
            break
        assert not [t for t in threading.enumerate() if t.name == "insitu-prefetch"]
        assert len(ds.pool._owners) == 0


def test_a_dataset_nobody_closed_hands_its_cache_lock_to_the_next_one(tmp_path: Path) -> None:
    """A collected dataset's disk cache (its lock, its spill files) is closed by the next dataset that opens."""
    path = _write_store(tmp_path)
    cache_dir = tmp_path / "cache"
    ds = _dataset(path, cache_dir=cache_dir, persist=True)
    for _ in ds.train:
        pass
    ds.train  # noqa: B018 - a view makes the dataset a cycle, which only the collector frees
    del ds
    gc.collect()  # inside a collection the finalizer may not wait: it hands the cache's close on
    assert lifecycle._later  # the close waits for a user's thread
    again = _dataset(path, cache_dir=cache_dir, persist=True)  # its writer lock is free again
    with again:
        assert sum(len(b) for b in again.train) == 64
        assert again.gets == 0  # every chunk revived from the cache the first dataset persisted


def test_ctrl_c_while_a_pass_starts_its_thread_is_a_keyboard_interrupt(tmp_path: Path, monkeypatch) -> None:
    """CPython's ``Thread.start`` interrupted by SIGINT can turn the KeyboardInterrupt into "release unlocked
    lock" (its Condition loses the lock it was retaking); the pass raises the KeyboardInterrupt itself, and the
    thread it started is stopped with the dataset."""
    path = _write_store(tmp_path)
    start = threading.Thread.start

    def interrupted_start(thread: threading.Thread) -> None:
        start(thread)
        if thread.name != "insitu-prefetch":
            return
        try:
            raise KeyboardInterrupt
        finally:  # what Condition.__exit__ raises after the lost re-acquire, the interrupt as its context
            raise RuntimeError("release unlocked lock")  # noqa: B012

    ds = _dataset(path)
    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        iter(ds.train)
    monkeypatch.undo()
    ds.close()
    assert not [t for t in threading.enumerate() if t.name == "insitu-prefetch"]
    with _dataset(path) as again:  # the store and the process are fine afterwards
        assert sum(len(b) for b in again.train) > 0


# --- a Ctrl-C is never lost in a hook Python calls by itself ----------------------------------------
# Python runs a pending signal's handler when it next enters Python code. Where that code is a hook Python
# calls by itself (a gc callback, a weak reference's callback, a finalizer), the KeyboardInterrupt can only
# be printed and dropped, and the script goes on. ``interrupt_main`` then the hook's trigger, both called
# from C (``map`` over ``operator.call``), makes the hook the first Python code after the signal.

HOOK_PROBES = textwrap.dedent(
    """
    import _thread, gc, operator, signal, sys, tempfile, weakref
    import zarr
    import insitubatch as ib
    signal.signal(signal.SIGINT, signal.default_int_handler)
    path = tempfile.mkdtemp() + "/d.zarr"
    zarr.open_group(path, mode="w").create_array("a", shape=(8, 2), chunks=(4, 2), dtype="f4")[...] = 1.0
    geoms = ib.open_geometries(path, variables=["a"])
    ds = ib.InSituDataset(path, ib.split_by_chunk(geoms["a"], fractions=(1.0,)), geoms, batch_size=4)

    def probe(name, trigger):
        try:
            list(map(operator.call, (_thread.interrupt_main, trigger)))
            print(name, "lost", flush=True)  # never reached if the interrupt is raised after the C call
        except KeyboardInterrupt:
            print(name, "raised", flush=True)

    class Member:
        pass

    class Faulty:
        def __del__(self):
            raise ValueError("a finalizer's own error")

    probe("collection", gc.collect)  # the collector's hooks: insitubatch's is C
    held = weakref.WeakSet()  # the standard library's: it drops a dead member in Python code
    holder = [Member()]
    held.add(holder[0])
    probe("weakset", holder.clear)
    faulty = [Faulty()]
    faulty.clear()  # any other unraisable error still reaches the hook insitubatch's replaced
    print("done", flush=True)
    """
)


def test_a_ctrl_c_is_never_lost_in_a_hook_python_calls_by_itself() -> None:
    """In a fresh interpreter, with what an open dataset installs."""
    done = subprocess.run([sys.executable, "-c", HOOK_PROBES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["collection raised", "weakset raised", "done"], done.stderr
    assert done.stderr.count("Exception ignored") == 1 and "ValueError: a finalizer's own error" in done.stderr
    assert "KeyboardInterrupt" not in done.stderr


class _Member:
    pass


def test_a_ctrl_c_pending_when_a_weakly_held_member_dies_is_raised_after_it() -> None:
    members: WeakMembers[_Member] = WeakMembers()
    holder = [_Member(), _Member()]
    members.add(holder[0])
    members.add(holder[1])
    assert len(members) == 2 and holder[0] in members and list(members) != []
    with _sigint_raises(), pytest.raises(KeyboardInterrupt):
        list(map(operator.call, (_thread.interrupt_main, holder.clear)))  # both die inside a C call
    assert len(members) == 0 and list(members) == []
    kept = _Member()
    members.add(kept)
    members.add(kept)
    assert len(members) == 1
    members.discard(kept)
    assert kept not in members and len(members) == 0


def test_the_package_keeps_no_weakset() -> None:
    """Every weak registry of the package is a WeakMembers (a WeakSet drops its dead in Python code)."""
    package = Path(ib.__file__).parent
    users = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = (
                (isinstance(node, ast.Attribute) and node.attr == "WeakSet")
                or (isinstance(node, ast.Name) and node.id == "WeakSet")
                or (isinstance(node, ast.ImportFrom) and any(alias.name == "WeakSet" for alias in node.names))
            )
            if named:
                users.append(f"{path.relative_to(package)}:{node.lineno}")
    assert users == []


def _interrupted_at_call(k: int, step: Callable[[], object]) -> bool:
    """Run ``step`` with a KeyboardInterrupt raised as its ``k``-th Python call starts; whether one was."""
    calls = 0

    def trace(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1
            if calls == k:
                raise KeyboardInterrupt  # Python unsets a trace function that raises: this fires once
        return None

    sys.settrace(trace)
    try:
        step()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def test_a_ctrl_c_at_any_call_of_taking_a_batch_leaves_the_pass_closable(tmp_path: Path) -> None:
    """A Ctrl-C lands where Python next enters Python code: at the start of each call ``next()`` makes in turn
    (a lock wrapper's ``__exit__`` among them in ``queue.Queue``), the pass must still close, not wait for ever
    on a lock the interrupt left held."""
    path = _write_store(tmp_path)
    ds = _dataset(path, prefetch_depth=1)
    interrupted = 0
    for k in range(1, 80):
        it = iter(ds.train)
        next(it)  # the producer is running and a batch waits
        if not _interrupted_at_call(k, functools.partial(next, it)):
            it.close()
            break
        interrupted += 1
        closer = threading.Thread(target=it.close, daemon=True)
        closer.start()
        closer.join(10.0)
        assert not closer.is_alive(), f"the pass did not close after a Ctrl-C at call {k} of next()"
    else:
        pytest.fail("next() made more than 80 Python calls")
    assert interrupted >= 1
    closer = threading.Thread(target=ds.close, daemon=True)
    closer.start()
    closer.join(10.0)
    assert not closer.is_alive()


# --- the process's hooks: installed by the first dataset that opens, given back by the last close ----------

HOOKS_SCRIPT = textwrap.dedent(
    """
    import gc, sys, tempfile, threading
    import zarr  # (imports concurrent.futures, which registers its own exit hook)
    before = (list(gc.callbacks), sys.unraisablehook, list(threading._threading_atexits))
    import insitubatch as ib

    def hooks():
        return (list(gc.callbacks), sys.unraisablehook, list(threading._threading_atexits))

    print("import", hooks() == before, flush=True)  # importing installs nothing
    path = tempfile.mkdtemp() + "/d.zarr"
    zarr.open_group(path, mode="w").create_array("a", shape=(8, 2), chunks=(4, 2), dtype="f4")[...] = 1.0
    geoms = ib.open_geometries(path, variables=["a"])
    print("geometries", hooks() == before, flush=True)
    manifest = ib.split_by_chunk(geoms["a"], fractions=(1.0,))
    first = ib.InSituDataset(path, manifest, geoms, batch_size=4)
    second = ib.InSituDataset(path, manifest, geoms, batch_size=4)
    cb, hook, exits = hooks()
    print("open", len(cb) == len(before[0]) + 1, hook is not before[1], len(exits) == len(before[2]) + 1, flush=True)
    sum(len(b) for b in first.train)
    first.close()
    print("one closed", hooks()[:2] == (cb, hook), flush=True)
    second.close()
    after = hooks()
    print("all closed", after[:2] == before[:2], len(after[2]) == len(before[2]) + 1, flush=True)
    with ib.InSituDataset(path, manifest, geoms, batch_size=4) as again:
        print("reopened", hooks()[:2] == (cb, hook), sum(len(b) for b in again.train), flush=True)
    print("closed again", hooks() == after, flush=True)
    """
)


def test_hooks_come_with_the_first_open_dataset_and_go_with_the_last_close() -> None:
    """``import insitubatch`` leaves ``gc.callbacks``, ``sys.unraisablehook`` and threading's exit hooks alone."""
    done = subprocess.run([sys.executable, "-c", HOOKS_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "import True",
        "geometries True",
        "open True True True",
        "one closed True",
        "all closed True True",  # the exit hook stays registered (CPython cannot unregister it); it does nothing now
        "reopened True 8",
        "closed again True",
    ], done.stderr


def test_a_hook_installed_over_ours_is_left_in_place() -> None:
    """Someone else's ``sys.unraisablehook`` set while a dataset is open stays set after the close (it may call ours)."""
    script = textwrap.dedent(
        """
        import sys, tempfile
        import zarr
        import insitubatch as ib
        path = tempfile.mkdtemp() + "/d.zarr"
        zarr.open_group(path, mode="w").create_array("a", shape=(8, 2), chunks=(4, 2), dtype="f4")[...] = 1.0
        geoms = ib.open_geometries(path, variables=["a"])
        ds = ib.InSituDataset(path, ib.split_by_chunk(geoms["a"], fractions=(1.0,)), geoms, batch_size=4)
        theirs = sys.unraisablehook
        def mine(unraisable):
            theirs(unraisable)
        sys.unraisablehook = mine
        ds.close()
        print(sys.unraisablehook is mine, flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"], done.stderr


def test_running_loop_is_the_loop_on_it_and_none_off_it() -> None:
    async def on_loop() -> bool:
        return lifecycle.running_loop() is asyncio.get_running_loop()

    assert lifecycle.running_loop() is None
    assert asyncio.run(on_loop())
