"""Injected time: the :class:`Clock` every waiting part of txmq goes through, and the real one.

Transaction checks, long polling, delay levels and expiry of clients and brokers all read the time and sleep through
a clock, so tests can replace 60-second schedules with ``txmq.testing.FakeClock.advance`` and run in milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TimerHandle(Protocol):
    def cancel(self) -> None: ...


@runtime_checkable
class Clock(Protocol):
    """What txmq needs from time. All methods are called from the event loop's thread unless stated."""

    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch (RocketMQ's timestamps). Thread-safe."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything. Thread-safe."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` on the event loop after ``seconds``; the handle cancels it."""
        ...


class SystemClock:
    """The real clock: ``time`` for readings, asyncio's loop for waiting."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, seconds), callback, *args)


SYSTEM_CLOCK = SystemClock()
