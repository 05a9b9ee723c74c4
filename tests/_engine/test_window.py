"""The read window: permits in ticket order (first come, first served without one), background waiters last; per-reader caps; a limit the controller moves."""

from __future__ import annotations

import asyncio

import pytest

from insitubatch._engine.reads.concurrency import ConcurrencyController
from insitubatch._engine.reads.window import ReadWindow


def run(coro):
    return asyncio.run(coro)


def test_a_fixed_window_admits_its_limit_and_then_queues_in_order() -> None:
    async def main() -> None:
        user = ReadWindow(2).user(2)
        order: list[int] = []
        assert user.try_acquire() and user.try_acquire()
        assert user.locked() and not user.try_acquire()

        async def take(i: int) -> None:
            await user.acquire()
            order.append(i)

        waiters = [asyncio.ensure_future(take(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert order == []
        for _ in range(3):
            user.release()
            await asyncio.sleep(0)
        await asyncio.gather(*waiters)
        assert order == [0, 1, 2]
        assert user.window.inflight == 2  # two of the three still hold theirs

    run(main())


def test_two_readers_share_the_limit_each_within_its_own_cap() -> None:
    async def main() -> None:
        window = ReadWindow(6)
        small, big = window.user(2), window.user(10)
        peak = {"total": 0, "small": 0}

        async def read(user, name: str) -> None:
            async with user:
                peak["total"] = max(peak["total"], window.inflight)
                if name == "small":
                    peak["small"] = max(peak["small"], user.held)
                await asyncio.sleep(0.001)

        await asyncio.gather(*(read(small, "small") for _ in range(20)), *(read(big, "big") for _ in range(20)))
        assert peak == {"total": 6, "small": 2}
        assert window.inflight == 0 and small.held == big.held == 0

    run(main())


def test_a_reader_at_its_cap_lets_the_next_waiter_go_first() -> None:
    async def main() -> None:
        window = ReadWindow(3)
        capped, other = window.user(1), window.user(3)
        assert capped.try_acquire() and other.try_acquire() and other.try_acquire()
        got: list[str] = []

        async def take(user, name: str) -> None:
            await user.acquire()
            got.append(name)

        first = asyncio.ensure_future(take(capped, "capped"))  # waits for its own cap, not the window
        second = asyncio.ensure_future(take(other, "other"))
        await asyncio.sleep(0)
        other.release()  # a window permit frees: the capped reader may not take it, the next waiter does
        await asyncio.sleep(0)
        assert got == ["other"]
        capped.release()
        await asyncio.gather(first, second)
        assert got == ["other", "capped"]

    run(main())


def test_a_cancelled_waiter_never_holds_a_permit() -> None:
    async def main() -> None:
        user = ReadWindow(1).user(1)
        await user.acquire()
        waiter = asyncio.ensure_future(user.acquire())
        await asyncio.sleep(0)
        user.release()  # handed to the waiter ...
        waiter.cancel()  # ... which is cancelled before it runs: the permit must come back
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert user.window.inflight == 0 and user.try_acquire()

    run(main())


def test_the_controller_moves_the_limit_and_the_readers_caps_bound_it() -> None:
    async def main() -> None:
        controller = ConcurrencyController(cap=256, start=4)
        window = ReadWindow(4, controller=controller, ceiling=256)
        user = window.user(16)
        assert user.try_acquire()
        assert controller.cap == 16  # the only active reader's cap
        controller.limit = 8
        assert window.limit == 8
        for _ in range(7):
            assert user.try_acquire()
        assert not user.try_acquire()
        second = window.user(100)
        assert second.try_acquire() is False  # the window, not its cap, is full
        controller.limit = 9
        assert second.try_acquire()
        assert controller.cap == 116
        user.leave()
        assert controller.cap == 100 and controller.limit == 9

    run(main())


def test_the_limit_outlives_readers_coming_and_going() -> None:
    async def main() -> None:
        controller = ConcurrencyController(cap=256, start=64)
        window = ReadWindow(64, controller=controller, ceiling=256)
        first = window.user(100)
        assert first.try_acquire()
        first.release()
        first.leave()  # the last reader left (a dataset closed): the next one starts where it ended
        assert controller.limit == 64
        fat = window.user(8)  # a reader of fat tiles alone: its cap holds the limit down ...
        assert fat.try_acquire()
        assert controller.limit == 8
        fat.release()
        second = window.user(100)
        assert second.try_acquire()  # ... and a reader with room brings it back to what the link had
        assert controller.cap == 108 and controller.limit == 64

    run(main())


def test_waiters_are_served_in_ticket_order_and_one_without_a_ticket_queues_behind_those_waiting() -> None:
    async def main() -> None:
        window = ReadWindow(1)
        user = window.user(1)
        early, late = window.ticket(), window.ticket()
        assert early < late
        assert user.try_acquire()
        order: list[str] = []

        async def take(name: str, ticket: int | None) -> None:
            await user.acquire(ticket)
            order.append(name)
            user.release()

        # arrival order: the late ticket, one with none, then the early ticket
        waiters = [asyncio.ensure_future(take("late", late)), asyncio.ensure_future(take("none", None))]
        await asyncio.sleep(0)
        waiters.append(asyncio.ensure_future(take("early", early)))
        await asyncio.sleep(0)
        user.release()
        await asyncio.gather(*waiters)
        assert order == ["early", "late", "none"]
        assert window.inflight == 0

    run(main())


def test_a_background_waiter_gets_a_permit_only_when_no_other_read_waits() -> None:
    async def main() -> None:
        window = ReadWindow(1)
        user = window.user(1)
        assert user.try_acquire()
        order: list[str] = []

        async def background() -> None:
            await user.acquire_idle()
            order.append("background")
            user.release()

        async def foreground(name: str) -> None:
            await user.acquire()
            order.append(name)
            await asyncio.sleep(0)
            user.release()

        waiters = [asyncio.ensure_future(background())]
        await asyncio.sleep(0)
        waiters += [asyncio.ensure_future(foreground(f"read-{i}")) for i in range(3)]
        await asyncio.sleep(0)
        user.release()
        await asyncio.gather(*waiters)
        assert order == ["read-0", "read-1", "read-2", "background"]
        # with nothing waiting and a permit free, a background read takes it at once
        await asyncio.wait_for(user.acquire_idle(), 1.0)
        assert window.inflight == 1 and user.locked()
        user.release()

    run(main())


def test_a_cancelled_ticketed_or_background_waiter_leaves_no_permit_behind() -> None:
    async def main() -> None:
        window = ReadWindow(1)
        user = window.user(1)
        assert user.try_acquire()
        ticketed = asyncio.ensure_future(user.acquire(window.ticket()))
        idle = asyncio.ensure_future(user.acquire_idle())
        await asyncio.sleep(0)
        ticketed.cancel()
        idle.cancel()
        await asyncio.gather(ticketed, idle, return_exceptions=True)
        user.release()
        assert window.inflight == 0 and not user.locked()

    run(main())


def test_a_batch_takes_the_free_permits_in_one_call_within_the_limit_and_its_cap_never_past_a_waiter() -> None:
    async def main() -> None:
        window = ReadWindow(5)
        a, b = window.user(3), window.user(5)
        assert a.take_free(10) == 3  # its cap
        assert b.take_free(10) == 2  # what the limit leaves
        assert window.inflight == 5 and b.take_free(1) == 0
        waiter = asyncio.ensure_future(b.acquire())
        await asyncio.sleep(0)
        a.release()  # the waiter gets it, not a batch arriving after it
        await asyncio.sleep(0)
        assert waiter.done() and window.inflight == 5
        a.release()
        assert a.take_free(4) == 1 and a.held == 2 and window.inflight == 5
        for _ in range(2):
            a.release()
        for _ in range(3):
            b.release()
        assert window.inflight == 0

    run(main())
