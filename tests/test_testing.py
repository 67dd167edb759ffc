"""txmq.testing: polling with one timeout, the fake clock's sleepers, in-memory connections, wait_idle."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from txmq.broker.topics import SCHEDULE_TOPIC
from txmq.errors import ConnectionClosedError
from txmq.net import Connection
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.record import MessageRecord
from txmq.testing import (
    FakeClock,
    InProcessBroker,
    aeventually,
    eventually,
    memory_connection_pair,
    settle,
    wait_idle,
)


def test_importing_it_does_not_import_pytest() -> None:
    code = "import sys, txmq.testing; assert 'pytest' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_eventually_returns_the_first_truthy_value() -> None:
    answers = iter([0, None, "", "yes"])
    assert eventually(lambda: next(answers), "an answer", interval=0) == "yes"


def test_eventually_says_what_never_happened() -> None:
    with pytest.raises(AssertionError, match=r"never happened within 0\.05s: the moon turns blue"):
        eventually(lambda: False, "the moon turns blue", timeout=0.05)


def test_eventually_retries_only_the_named_exceptions_and_reports_the_last() -> None:
    def flaky() -> bool:
        raise LookupError("not yet")

    with pytest.raises(AssertionError, match=r"a route \(last error: LookupError\('not yet'\)\)") as info:
        eventually(flaky, "a route", timeout=0.05, retry_on=(LookupError,))
    assert isinstance(info.value.__cause__, LookupError)
    with pytest.raises(LookupError):
        eventually(flaky, "a route", timeout=0.05)


async def test_aeventually_awaits_async_conditions_and_lets_the_loop_run() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, done.set)

    async def is_done() -> bool:
        return done.is_set()

    assert await aeventually(is_done, "the event") is True
    with pytest.raises(AssertionError, match=r"never happened within 0\.05s: nothing"):
        await aeventually(lambda: False, "nothing", timeout=0.05)


async def test_fake_clock_knows_who_is_asleep_until_their_deadline() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(5))
    await settle()
    assert clock.is_sleeping(task)
    await clock.advance(4.9)
    assert clock.is_sleeping(task)
    await clock.advance(0.1)
    assert task.done() and not clock.is_sleeping(task)


def echo(_conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ext_fields=dict(cmd.ext_fields), body=cmd.body)


async def test_memory_pair_carries_requests_both_ways_and_oneways() -> None:
    oneways: list[bytes] = []

    def server(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.flag & 2:
            oneways.append(cmd.body)
            return None
        return echo(conn, cmd)

    client, srv = memory_connection_pair(echo, server)
    resp = await client.request(RemotingCommand.request(10, {"k": "v"}, b"body"), timeout=5)
    assert (resp.ext_fields, resp.body) == ({"k": "v"}, b"body")
    back = await srv.request(RemotingCommand.request(39, {}, b"check"), timeout=5)
    assert back.body == b"check"
    client.send_oneway(RemotingCommand.request(10, {}, b"fire"))
    await aeventually(lambda: oneways == [b"fire"], "the oneway arrives")
    assert client.peer == srv.local and srv.peer == client.local


async def test_memory_pair_close_fails_pending_requests_on_both_ends() -> None:
    never = asyncio.Event()

    async def stuck(_conn: Connection, _cmd: RemotingCommand) -> None:
        await never.wait()

    client, srv = memory_connection_pair(None, stuck)
    pending = asyncio.create_task(client.request(RemotingCommand.request(10, {}), timeout=30))
    await aeventually(lambda: srv.in_flight == 1, "the request reaches the server")
    srv.close()
    with pytest.raises(ConnectionClosedError):
        await pending
    await asyncio.wait_for(client.wait_closed(), 5)
    await asyncio.wait_for(srv.wait_closed(), 5)
    assert client.closed and srv.closed


async def test_memory_pair_has_backpressure() -> None:
    release = asyncio.Event()
    handled: list[int] = []

    async def slow(_conn: Connection, cmd: RemotingCommand) -> None:
        await release.wait()
        handled.append(len(cmd.body))

    client, srv = memory_connection_pair(None, slow, max_in_flight=1)
    for _ in range(20):
        client.send_oneway(RemotingCommand.request(10, {}, b"x" * 100_000))
    await aeventually(lambda: srv.reading_paused, "the server stops reading")
    assert client.write_buffer_size() > 1_000_000
    release.set()
    await aeventually(lambda: len(handled) == 20, "every request is served")
    assert client.write_buffer_size() == 0 and not srv.reading_paused


async def test_wait_idle_lets_a_due_delay_level_deliver(tmp_path: Path) -> None:
    harness = InProcessBroker(tmp_path, message_delay_level="2s")
    broker = await harness.start()
    try:
        assert broker.store is not None
        store = broker.store
        record = broker.schedule.redirect(MessageRecord(topic="T", body=b"later", queue_id=0), 1)
        assert record.topic == SCHEDULE_TOPIC
        assert (await store.put(record)).ok
        await wait_idle(broker)
        assert store.max_offset("T", 0) == 0
        await harness.clock.advance(2)
        await wait_idle(broker)
        assert store.max_offset("T", 0) == 1
    finally:
        await harness.stop()


async def test_wait_idle_needs_a_fake_clock() -> None:
    class NotFake:
        clock = object()

    with pytest.raises(TypeError):
        await wait_idle(NotFake())  # type: ignore[arg-type]


def test_without_what_the_message_quotes_the_condition() -> None:
    with pytest.raises(AssertionError, match=r"lambda: 1 \+ 1 == 3"):
        eventually(lambda: 1 + 1 == 3, timeout=0.01)


def test_free_ports_of_two_xdist_workers_never_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker takes even ports from its own share (their neighbours are the HA ports), and a process never
    hands out a port twice."""
    from txmq.testing import free_port

    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    given: dict[int, list[int]] = {}
    for index in (0, 1):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        given[index] = [free_port() for _ in range(50)]
        assert all(p % 2 == 0 and (p // 2) % 2 == index for p in given[index]), given[index]
    everything = given[0] + given[1]
    assert len(set(everything)) == len(everything)
