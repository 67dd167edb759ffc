"""The injected clock: the fake clock fires timers in order and wakes sleepers only when time moves."""

from __future__ import annotations

import asyncio

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.testing import FakeClock, settle


async def test_fake_sleep_wakes_only_after_advance() -> None:
    clock = FakeClock(start_ms=1000)
    woke: list[float] = []

    async def sleeper(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(clock.monotonic())

    tasks = [asyncio.create_task(sleeper(s)) for s in (6, 1, 60)]
    await settle()
    assert woke == []
    await clock.advance(5.9)
    assert woke == [1]
    await clock.advance(0.1)
    assert woke == [1, 6]
    assert clock.now_ms() == 7000
    await clock.advance(100)
    assert woke == [1, 6, 60]
    assert clock.monotonic() == 106
    await asyncio.gather(*tasks)


async def test_call_later_cancel_and_order() -> None:
    clock = FakeClock()
    fired: list[str] = []
    clock.call_later(2, fired.append, "b")
    clock.call_later(1, fired.append, "a")
    h = clock.call_later(1.5, fired.append, "cancelled")
    clock.call_later(2, fired.append, "c")
    h.cancel()
    assert clock.pending_timers() == 3
    await clock.advance(10)
    assert fired == ["a", "b", "c"]


async def test_periodic_task_runs_each_interval() -> None:
    """A loop that sleeps 60 s runs 15 times in 15 simulated minutes, with no real waiting."""
    clock = FakeClock()
    runs: list[int] = []

    async def periodic() -> None:
        while True:
            await clock.sleep(60)
            runs.append(clock.now_ms())

    task = asyncio.create_task(periodic())
    await clock.advance(15 * 60)
    task.cancel()
    assert len(runs) == 15
    assert runs[1] - runs[0] == 60_000


async def test_cancelled_sleeper_leaves_no_live_timer() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(30))
    await settle()
    task.cancel()
    await settle()
    assert clock.pending_timers() == 0


async def test_system_clock_is_a_clock() -> None:
    assert isinstance(SYSTEM_CLOCK, Clock) and isinstance(FakeClock(), Clock)
    fired = asyncio.Event()
    SYSTEM_CLOCK.call_later(0.001, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    assert SYSTEM_CLOCK.now_ms() > 1_600_000_000_000
