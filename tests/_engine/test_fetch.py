"""The fetcher against the loopback emulator: bytes and ranges, hedging, throttling, stalls and give-up bounds."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from insitubatch._engine.reads.deadlines import Deadlines
from insitubatch._engine.reads.fetch import Fetcher
from insitubatch._engine.reads.store_link import HEDGE_BURST, HEDGE_FLOOR_S, HEDGE_SHARE, STALL_FLOOR_S, client_for
from insitubatch._engine.reads.window import ReadWindow
from insitubatch._engine.stats import PassCounters
from insitubatch.stores.obstore_stores import obstore_store
from insitubatch.stores.owned import close_store
from insitubatch.testing.emulator import Emulator

N_KEYS = 480  # distinct keys, so that two requests for one key in a run are a read and its duplicate
KEY_BYTES = 3000
BUCKET = "bkt"
# a loaded 2-core CI machine: the bounds below carry this much slack on top of what the rules promise
SLACK_S = 2.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    d = tmp_path / BUCKET / "d"
    d.mkdir(parents=True)
    for i in range(N_KEYS):
        (d / f"k{i}").write_bytes(rng.integers(0, 256, KEY_BYTES + i, dtype=np.uint8).tobytes())
    (d / "empty").write_bytes(b"")
    return tmp_path


def content(root: Path, key: str) -> bytes:
    return (root / BUCKET / key).read_bytes()


def fetcher_for(store, *, hedge: bool = True, limit: int = 32) -> Fetcher:
    return Fetcher(client_for(store), ReadWindow(limit).user(limit), PassCounters(), hedge=hedge)


def http_store(emu: Emulator, **kw):
    return obstore_store(emu.url_for(BUCKET), read_only=True, **kw)


def count_deadline_timers(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count, from now on, the loop timers the link's deadline heap sets (the pool's connect timers are not its):
    the one-element list's count grows with each."""
    count = [0]
    call_at = loop.call_at

    def counted(when, callback, *args, **kw):
        count[0] += type(getattr(callback, "__self__", None)).__module__ == Deadlines.__module__
        return call_at(when, callback, *args, **kw)

    loop.call_at = counted  # type: ignore[method-assign]
    return count


def read_all(fetcher: Fetcher, keys: list[str], concurrency: int = 16) -> tuple[list, float]:
    """Every key through the fetcher, ``concurrency`` at a time, on a fresh loop; (answers, seconds)."""

    async def main() -> list:
        sem = asyncio.Semaphore(concurrency)

        async def one(key: str):
            async with sem:
                return await fetcher.get(key)

        return await asyncio.gather(*(one(k) for k in keys))

    t0 = time.perf_counter()
    answers = asyncio.run(main())
    return answers, time.perf_counter() - t0


def keys(n: int = N_KEYS) -> list[str]:
    return [f"d/k{i % N_KEYS}" for i in range(n)]


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_whole_keys_ranges_and_missing_keys_over_http_and_s3(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        stores = {
            "http": http_store(emu),
            "s3": obstore_store(f"s3://{BUCKET}", endpoint=emu.url, anonymous=True, region="us-east-1"),
        }
        for kind, store in stores.items():
            f = fetcher_for(store)
            data = content(root, "d/k7")

            async def main(f=f):
                return (
                    await f.get("d/k7"),
                    await f.get("d/k7", RangeByteRequest(10, 20)),
                    await f.get("d/k7", OffsetByteRequest(KEY_BYTES)),
                    await f.get("d/k7", SuffixByteRequest(5)),
                    await f.get("d/missing"),
                    await f.get("d/empty"),
                )

            whole, part, tail, suffix, missing, empty = asyncio.run(main())
            assert whole is not None and whole.to_bytes() == data, kind
            assert part is not None and part.to_bytes() == data[10:20], kind
            assert tail is not None and tail.to_bytes() == data[KEY_BYTES:], kind
            assert suffix is not None and suffix.to_bytes() == data[-5:], kind
            assert missing is None, kind
            assert empty is not None and empty.to_bytes() == b"", kind
            assert f.counters.gets == 6 and f.counters.get_bytes == len(data) + 10 + 7 + 5, kind
            close_store(store)


def test_a_uniform_latency_store_gets_no_duplicate(root: Path) -> None:
    with Emulator(root, latency_s=0.03, jitter_s=0.005) as emu:
        store = http_store(emu)
        f = fetcher_for(store)
        answers, _ = read_all(f, keys(240))
        assert all(a is not None for a in answers)
        assert f.counters.hedged == 0 and emu.stats().gets == 240
        close_store(store)


def test_stragglers_get_one_duplicate_past_the_threshold_within_the_cap_and_the_loser_is_cancelled(
    root: Path,
) -> None:
    with Emulator(root, latency_s=0.02, jitter_s=0.002, straggler_share=0.05, straggler_s=3.0, seed=2) as emu:
        store = http_store(emu)
        f = fetcher_for(store)
        launched: dict[str, list[float]] = {}
        request = f.backend.request

        def recording(key, byte_range=None):
            launched.setdefault(key, []).append(time.monotonic())
            return request(key, byte_range)

        f.backend.request = recording  # type: ignore[method-assign]
        read_all(f, keys(64))  # the link learns its latency (no duplicates before 32 GETs)
        launched.clear()
        f.counters = PassCounters()
        n = 400
        todo = [f"d/k{i}" for i in range(64, 64 + n)]
        answers, seconds = read_all(f, todo, concurrency=32)
        # byte-identical, whichever request won
        assert [a.to_bytes() for a in answers] == [content(root, k) for k in todo]
        c = f.counters
        assert c.hedged > 0 and 0 < c.hedge_wins <= c.hedged
        assert c.hedged <= HEDGE_BURST + HEDGE_SHARE * n
        # a duplicate only past the threshold: never sooner than the floor after its first request
        # (a straggler the budget could not hedge is abandoned at the stall time and asked again: a retry)
        assert sum(len(t) - 1 for t in launched.values()) == c.hedged + c.retries
        assert all(t[1] - t[0] >= HEDGE_FLOOR_S for t in launched.values() if len(t) > 1)
        # each winning duplicate's first request was cancelled: the server saw its client leave
        wait_for(lambda: emu.stats().abandoned >= c.hedge_wins)
        # the 3 s stragglers did not each cost 3 s: a duplicate answered in tens of milliseconds
        assert seconds < 3.0 * emu.stats().stragglers / 2
        close_store(store)


def test_hedge_false_sends_every_get_once(root: Path) -> None:
    with Emulator(root, latency_s=0.005, jitter_s=0.0, straggler_share=0.1, straggler_s=0.5, seed=3) as emu:
        store = http_store(emu)
        f = fetcher_for(store, hedge=False)
        read_all(f, keys(200), concurrency=32)
        assert f.counters.hedged == 0 and emu.stats().gets == 200
        close_store(store)


def test_throttling_answers_are_retried_and_cut_the_shared_limit(root: Path) -> None:
    with Emulator(root, latency_s=0.002, jitter_s=0.0, throttle_share=0.3, seed=4) as emu:
        store = http_store(emu, retry={"backoff": {"init_backoff": timedelta(milliseconds=5), "base": 2}})
        f = fetcher_for(store)
        answers, _ = read_all(f, keys(150))
        assert [a.to_bytes() for a in answers] == [content(root, k) for k in keys(150)]
        c = f.counters
        assert 0 < c.throttled <= emu.stats().throttled
        assert c.retries >= c.throttled
        assert f.link.controller.cuts >= 1 and f.link.controller.throttled == c.throttled
        close_store(store)


def test_a_get_held_open_forever_is_retried_on_a_fresh_request_after_the_stall_time(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0, hold_key=f"{BUCKET}/d/k3", hold_times=1) as emu:
        store = http_store(emu)
        f = fetcher_for(store, hedge=False)
        answers, seconds = read_all(f, ["d/k3"])
        assert answers[0].to_bytes() == content(root, "d/k3")
        assert STALL_FLOOR_S <= seconds < STALL_FLOOR_S + SLACK_S
        assert f.counters.stalls == 1 and f.counters.retries == 1
        wait_for(lambda: emu.stats().abandoned == 1)  # the silent request was closed, not left hanging
        assert emu.stats().gets == 2
        close_store(store)


def test_a_silent_get_is_hedged_long_before_it_stalls(root: Path) -> None:
    with Emulator(root, latency_s=0.02, jitter_s=0.0) as emu:
        store = http_store(emu)
        f = fetcher_for(store)
        read_all(f, keys(64))
        emu.configure(hold_key=f"{BUCKET}/d/k5", hold_times=1)
        answers, seconds = read_all(f, ["d/k5"])
        assert answers[0].to_bytes() == content(root, "d/k5")
        assert seconds < 1.0 and f.counters.hedge_wins == 1 and f.counters.stalls == 0
        close_store(store)


def test_an_object_that_never_answers_fails_naming_the_key_within_the_retry_timeout(root: Path) -> None:
    retry_timeout = 4.0
    with Emulator(root, latency_s=0.0, jitter_s=0.0, hold_key=f"{BUCKET}/d/k9") as emu:
        store = http_store(emu, retry={"retry_timeout": timedelta(seconds=retry_timeout)})
        f = fetcher_for(store, hedge=False)
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match="gave up on 'd/k9' after 2 attempt"):
            read_all(f, ["d/k9"])
        # no attempt starts after retry_timeout, and a silent one is cut where the window ends (>= the floor)
        assert time.perf_counter() - t0 < retry_timeout + STALL_FLOOR_S + SLACK_S
        assert f.counters.stalls == 2
        close_store(store)


def test_a_denied_key_fails_at_once_and_a_transient_failure_is_retried(root: Path) -> None:
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        store = http_store(emu)
        f = fetcher_for(store)
        emu.inject("403", f"{BUCKET}/d/k1")
        emu.inject("500", f"{BUCKET}/d/k2", times=2)
        with pytest.raises(Exception, match="403"):
            read_all(f, ["d/k1"])
        assert emu.stats().keys[f"{BUCKET}/d/k1"].gets == 1
        answers, _ = read_all(f, ["d/k2"])
        assert answers[0].to_bytes() == content(root, "d/k2") and f.counters.retries == 2
        close_store(store)


def _emulator_on_a_port_naming_416(root: Path) -> Emulator:
    for port in range(41600, 41700):
        try:
            return Emulator(root, latency_s=0.0, jitter_s=0.0, port=port)
        except OSError:
            continue
    raise RuntimeError("no free port in 41600..41699")


def test_a_server_error_from_a_port_that_reads_416_is_retried_not_taken_for_an_empty_object(root: Path) -> None:
    # the error's message carries the URL: only its status code may say "416 Range Not Satisfiable"
    with _emulator_on_a_port_naming_416(root) as emu:
        store = http_store(emu)
        f = fetcher_for(store)
        emu.inject("500", f"{BUCKET}/d/k3", times=2)
        answers, _ = read_all(f, ["d/k3"])
        assert answers[0].to_bytes() == content(root, "d/k3")
        assert f.counters.retries == 2 and emu.stats().keys[f"{BUCKET}/d/k3"].gets == 3
        close_store(store)


@pytest.mark.parametrize("where", ["answer", "hedge timer"])
def test_a_fault_in_the_reads_own_bookkeeping_fails_the_read_instead_of_stranding_it(root: Path, where: str) -> None:
    """A step of a read runs as a loop callback, where an exception is only logged: the read must fail with it."""
    with Emulator(root, latency_s=0.0 if where == "answer" else 1.0, jitter_s=0.0) as emu:
        store = http_store(emu)
        f = fetcher_for(store)

        class Broken(RuntimeError):
            pass

        def broken(*args, **kwargs) -> None:
            raise Broken(f"the {where}'s bookkeeping failed")

        if where == "answer":
            f.window.completed = broken  # type: ignore[method-assign]
        else:  # the answer takes 1 s: the hedge timer, due at 50 ms, fires first
            f.link.hedge_after = lambda: 0.05  # type: ignore[method-assign]
            f.link.take_hedge = broken  # type: ignore[method-assign]

        async def main() -> None:
            await asyncio.wait_for(f.get("d/k1"), timeout=10)

        with pytest.raises(Broken):
            asyncio.run(main())
        close_store(store)


def test_one_iterations_reads_go_out_as_one_batch_and_their_deadlines_share_one_timer(root: Path) -> None:
    """N reads started together: one ``request_many`` of N, a handful of loop timers (not one or two per GET),
    and every answer equal to the file; a stall still cuts a silent read afterwards (test_stalls_*)."""
    n = 64
    with Emulator(root, latency_s=0.05, jitter_s=0.0) as emu:
        store = http_store(emu)
        f = fetcher_for(store, limit=n)
        batches: list[int] = []
        request_many = f.backend.request_many

        def recorded(requests):
            batches.append(len(requests))
            return request_many(requests)

        f.backend.request_many = recorded  # type: ignore[method-assign]
        timers = [0]

        async def main() -> list:
            nonlocal timers
            loop = asyncio.get_running_loop()
            timers = count_deadline_timers(loop)
            outcomes = [loop.create_future() for _ in range(n)]
            for i, outcome in enumerate(outcomes):
                f.start(f"d/k{i}", None, None, lambda buf, exc, o=outcome: o.set_result((buf, exc)))
            return await asyncio.gather(*outcomes)

        answers = asyncio.run(main())
        for i, (buf, exc) in enumerate(answers):
            assert exc is None and buf is not None and buf.to_bytes() == content(root, f"d/k{i}")
        assert batches == [n]
        assert 1 <= timers[0] <= 4  # the heap's timer, moved only for an earlier deadline (the first, and few after)
        assert f.counters.gets == n
        close_store(store)


def test_two_passes_on_one_link_share_one_deadline_timer(root: Path) -> None:
    """Two fetchers (two passes) of one endpoint put their reads' hedge and stall times in the link's one heap:
    a handful of loop timers for both, each answer equal to the file."""
    n = 32
    with Emulator(root, latency_s=0.05, jitter_s=0.0) as emu:
        stores = [http_store(emu), http_store(emu)]
        first, second = (fetcher_for(store, limit=n) for store in stores)
        assert first.link is second.link  # (one endpoint, one link)
        timers = [0]

        async def main() -> list:
            nonlocal timers
            loop = asyncio.get_running_loop()
            timers = count_deadline_timers(loop)
            outcomes = []
            for i in range(n):
                for f in (first, second):
                    outcome = loop.create_future()
                    f.start(f"d/k{i}", None, None, lambda buf, exc, o=outcome: o.set_result((buf, exc)))
                    outcomes.append((i, outcome))
            assert first.deadlines is second.deadlines is first.link.deadlines(loop)
            return [(i, await o) for i, o in outcomes]

        for i, (buf, exc) in asyncio.run(main()):
            assert exc is None and buf is not None and buf.to_bytes() == content(root, f"d/k{i}")
        assert 1 <= timers[0] <= 4  # the one heap's timer, moved only for an earlier deadline
        assert first.counters.gets == second.counters.gets == n
        for store in stores:
            close_store(store)


def test_a_finished_read_is_not_held_by_its_deadline_still_to_come(root: Path) -> None:
    """Once its answer lands, a read (and through it the fetcher and the store's backend) is let go by the link's
    heap at once, not when its stall time (seconds away) comes: a closed pass leaves no connection held open."""
    with Emulator(root, latency_s=0.0, jitter_s=0.0) as emu:
        store = http_store(emu)
        f = fetcher_for(store, limit=4)
        gone = weakref.ref(f)

        async def main(f: Fetcher) -> tuple:
            loop = asyncio.get_running_loop()
            outcome = loop.create_future()
            f.start("d/k0", None, None, lambda buf, exc: outcome.set_result((buf, exc)))
            return await outcome

        buf, exc = asyncio.run(main(f))
        assert exc is None and buf is not None and buf.to_bytes() == content(root, "d/k0")
        assert f.link.stall_after(f.policy) >= STALL_FLOOR_S  # its stall deadline is still seconds away
        del f
        gc.collect()
        assert gone() is None
        close_store(store)


def test_deadlines_forget_lets_go_of_the_read() -> None:
    class Racer:
        def racing(self, attempt: int) -> bool:
            return True

        def tick(self, now: float) -> None:
            raise AssertionError("a forgotten deadline never ticks")

    loop = asyncio.new_event_loop()
    try:
        deadlines = Deadlines(loop)
        racer = Racer()
        gone = weakref.ref(racer)
        entry = deadlines.add(loop.time() + 60.0, racer, 1)
        Deadlines.forget(entry)
        del racer
        gc.collect()
        assert gone() is None
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
