"""Stopping the slave's replication task when a cancellation is lost: the controller's loop awaits this stop before
it follows a new master or campaigns, so a task that goes on after one cancel() must not hold it for ever."""

from __future__ import annotations

import asyncio

from txmq.broker.ha.slave import _cancel_and_wait


async def test_a_task_that_lost_a_cancellation_is_cancelled_again_until_it_ends() -> None:
    lost = 0

    async def replicating() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost += 1  # as if an asyncio.timeout around a read had turned it into its own expiry

    task = asyncio.create_task(replicating())
    await asyncio.sleep(0)
    await asyncio.wait_for(_cancel_and_wait(task), 10)
    assert task.cancelled() and lost == 1


async def test_a_task_that_failed_or_finished_is_waited_for_quietly() -> None:
    async def failing() -> None:
        raise OSError("link lost")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    await _cancel_and_wait(task)
    assert isinstance(task.exception(), OSError)
