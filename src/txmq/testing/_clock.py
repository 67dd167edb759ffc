"""The fake clock: time moves only when a test says so, and it knows which tasks are asleep on it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from txmq.clock import TimerHandle


class _FakeTimer:
    __slots__ = ("args", "callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A deterministic :class:`txmq.clock.Clock` for tests. Time moves only when the test calls :meth:`advance`.

    ``now_ms`` starts at ``start_ms`` (a fixed date by default) and ``monotonic`` at 0. Timers fire in deadline order,
    ties in the order they were scheduled, each seeing the clock at its own deadline.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._start_ms = start_ms
        self._now = 0.0  # seconds since start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()
        self._sleepers: set[asyncio.Task[Any]] = set()

    def now_ms(self) -> int:
        return self._start_ms + round(self._now * 1000)

    def monotonic(self) -> float:
        return self._now

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        timer = _FakeTimer(self._now + max(0.0, seconds), callback, args)
        heapq.heappush(self._timers, (timer.deadline, next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        task = asyncio.current_task()

        def wake() -> None:
            self._sleepers.discard(task)  # type: ignore[arg-type]
            if not fut.done():
                fut.set_result(None)

        handle = self.call_later(seconds, wake)
        if task is not None:
            self._sleepers.add(task)
        try:
            await fut
        finally:
            handle.cancel()
            self._sleepers.discard(task)  # type: ignore[arg-type]

    def is_sleeping(self, task: asyncio.Task[Any]) -> bool:
        """True while ``task`` waits in :meth:`sleep` for a deadline that has not come yet."""
        return task in self._sleepers

    def pending_timers(self) -> int:
        """How many timers are scheduled and not cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_deadline(self) -> float | None:
        """Seconds from now until the next live timer, or None."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return None if not self._timers else max(0.0, self._timers[0][0] - self._now)

    def _fire_due(self, until: float) -> int:
        fired = 0
        while self._timers and self._timers[0][0] <= until:
            deadline, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, deadline)
            timer.callback(*timer.args)
            fired += 1
        return fired

    async def advance(self, seconds: float, *, settle_rounds: int = 20) -> None:
        """Move time forward by ``seconds``, firing due timers in order and letting woken tasks run.

        Between timers the event loop gets ``settle_rounds`` turns, so a task woken by one timer can schedule the
        next before time moves past it.
        """
        target = self._now + max(0.0, seconds)
        await settle(settle_rounds)
        while True:
            nxt = self.next_deadline()
            if nxt is None or self._now + nxt > target:
                break
            self._fire_due(self._now + nxt)
            await settle(settle_rounds)
        self._now = target
        await settle(settle_rounds)


async def settle(rounds: int = 20) -> None:
    """Give the event loop ``rounds`` turns so that ready tasks run to their next wait."""
    for _ in range(rounds):
        await asyncio.sleep(0)
