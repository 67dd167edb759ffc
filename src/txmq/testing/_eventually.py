"""Polling for a condition, blocking and async, with one default timeout and a message naming what never happened."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
"""Seconds any wait in txmq's tests may take: a cap for a slow machine, never a timing assertion."""

DEFAULT_INTERVAL = 0.02


def _failure(cond: Callable[..., Any], what: str | None, timeout: float, last: BaseException | None) -> AssertionError:
    if what is None:
        try:  # a lambda's source line says what it waited for better than "<lambda>"
            what = inspect.getsource(cond).strip()
        except (OSError, TypeError):
            what = getattr(cond, "__qualname__", repr(cond))
    tail = f" (last error: {last!r})" if last is not None else ""
    return AssertionError(f"never happened within {timeout:g}s: {what}{tail}")


def eventually(
    cond: Callable[[], T],
    what: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``cond()`` until it returns something truthy, and return that; block the thread in between.

    An exception of a type in ``retry_on`` counts as "not yet". After ``timeout`` seconds an AssertionError says
    ``what`` never happened (and the last such exception).
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = cond()
            if result:
                return result
        except retry_on as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _failure(cond, what, timeout, last) from last
        time.sleep(interval)


async def aeventually(
    cond: Callable[[], T | Awaitable[T]],
    what: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`eventually` for the event loop: ``cond`` may be a plain or an ``async`` callable; the loop keeps
    running between tries."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = cond()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result  # type: ignore[return-value]
        except retry_on as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _failure(cond, what, timeout, last) from last
        await asyncio.sleep(interval)
