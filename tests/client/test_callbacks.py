"""The one rule for user callables that may be plain or ``async def`` (txmq.client.callbacks)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from typing import Any

import pytest

from txmq.client.callbacks import call_user, call_user_blocking, is_async_callable


async def async_fn(x: int) -> int:
    return x + 1


def plain_fn(x: int) -> int:
    return x + 1


class AsyncCall:
    async def __call__(self, x: int) -> int:
        return x + 1


class PlainCall:
    def __call__(self, x: int) -> int:
        return x + 1


class Listener:
    async def on_async(self, x: int) -> int:
        return x + 1

    def on_plain(self, x: int) -> int:
        return x + 1


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (async_fn, True),
        (functools.partial(functools.partial(async_fn)), True),
        (AsyncCall(), True),
        (Listener().on_async, True),
        (plain_fn, False),
        (lambda x: x, False),
        (functools.partial(plain_fn), False),
        (PlainCall(), False),
        (Listener().on_plain, False),
    ],
    ids=[
        "async def",
        "partial of async",
        "async __call__",
        "async method",
        "plain",
        "lambda",
        "partial of plain",
        "plain __call__",
        "plain method",
    ],
)
def test_what_counts_as_async(fn: Any, expected: bool) -> None:
    assert is_async_callable(fn) is expected
    assert is_async_callable(fn) is expected  # the second answer comes from the cache


async def test_from_the_loop_plain_functions_run_in_the_executor_and_async_ones_on_the_loop() -> None:
    loop_thread = threading.current_thread().name
    seen: list[str] = []

    def plain(x: int) -> int:
        seen.append(threading.current_thread().name)
        return x * 2

    async def in_loop(x: int) -> int:
        seen.append(threading.current_thread().name)
        return x * 3

    def returns_awaitable(x: int) -> Any:
        return async_fn(x)

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="user-pool") as pool:
        assert await call_user(plain, 5, executor=pool) == 10
        assert await call_user(in_loop, 5, executor=pool) == 15
        assert await call_user(returns_awaitable, 5, executor=pool) == 6
    assert seen[0].startswith("user-pool") and seen[1] == loop_thread
    with pytest.raises(ZeroDivisionError):
        await call_user(lambda: 1 / 0)


def test_from_a_plain_thread_the_callable_runs_here_and_awaitables_are_finished_by_run() -> None:
    here = threading.current_thread().name
    where: list[str] = []

    def plain(x: int) -> int:
        where.append(threading.current_thread().name)
        return x * 2

    assert call_user_blocking(plain, 4, run=asyncio.run) == 8
    assert where == [here]
    assert call_user_blocking(async_fn, 4, run=asyncio.run) == 5
    assert call_user_blocking(AsyncCall(), 4, run=asyncio.run) == 5
