"""Offset reset on a live group, and dead letters through the CLI, against a real broker process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import orjson

from txmq.client import Admin, ConsumeFromWhere, ConsumeStatus, Message, Producer, PushConsumer
from txmq.net import connect
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import aeventually


async def txmq_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "txmq", *args], capture_output=True, text=True, timeout=60
    )


async def create_topic(admin: Admin, broker_addr: str, topic: str, queues: int) -> None:
    await admin.create_topic(topic, broker_addr=broker_addr, read_queue_nums=queues, write_queue_nums=queues)

    async def routed() -> bool:
        try:
            route = await admin.topic_route(topic)
        except Exception:
            return False
        return bool(route.broker_datas)

    await aeventually(routed, f"a route for {topic}", timeout=60)


async def create_group(broker_addr: str, group: str, retry_max_times: int) -> None:
    host, port = broker_addr.rsplit(":", 1)
    conn = await connect(host, int(port))
    try:
        body = orjson.dumps({"groupName": group, "retryMaxTimes": retry_max_times})
        cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
        assert (await conn.request(cmd, timeout=5)).code == 0
    finally:
        conn.close()


async def test_reset_offset_makes_a_live_group_reread(make_cluster: Any) -> None:
    cluster = make_cluster()
    ns = cluster.namesrv_addr
    topic, group = "ResetT", "ResetG"
    async with Admin(ns) as admin:
        await create_topic(admin, cluster.broker_addr, topic, 2)
    seen: Counter[bytes] = Counter()

    async def listener(msgs: list[Any]) -> ConsumeStatus:
        for m in msgs:
            seen[m.body] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    async with Producer("ResetP", ns) as producer:
        for i in range(20):
            await producer.send(Message(topic, f"a{i}".encode()))
        consumer = PushConsumer(group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        consumer.subscribe(topic)
        consumer.register_listener(listener)
        await consumer.start()
        try:
            first = {f"a{i}".encode() for i in range(20)}
            await aeventually(lambda: set(seen) == first, "the first pass", timeout=60)
            assert set(seen.values()) == {1}

            cli = await txmq_cli("admin", "-n", ns, "consumer", "reset-offset", group, topic, "--to", "earliest")
            assert cli.returncode == 0, cli.stderr
            assert "1 online consumer" in cli.stdout
            await aeventually(
                lambda: all(seen[b] == 2 for b in first), "every message read again after the reset", timeout=60
            )

            mark = str(int(time.time() * 1000))
            await asyncio.sleep(0.05)  # store times of the next sends are after the mark
            for i in range(5):
                await producer.send(Message(topic, f"b{i}".encode()))
            later = {f"b{i}".encode() for i in range(5)}
            await aeventually(lambda: all(seen[b] == 1 for b in later), "the new messages", timeout=60)
            cli = await txmq_cli("admin", "-n", ns, "consumer", "reset-offset", group, topic, "--to", mark)
            assert cli.returncode == 0, cli.stderr
            await aeventually(
                lambda: all(seen[b] == 2 for b in later), "the messages after the timestamp again", timeout=60
            )
            cli = await txmq_cli("admin", "-n", ns, "consumer", "reset-offset", group, topic, "--to", "latest")
            assert cli.returncode == 0, cli.stderr

            async def no_lag() -> bool:
                return await admin_lag(ns, group, topic) == 0

            await aeventually(no_lag, "the group at the end of the topic", timeout=60)
            await asyncio.sleep(1.0)  # give a wrong re-delivery the chance to show up
            assert all(seen[b] == 2 for b in first), "a reset to a timestamp re-read older messages"
            assert all(seen[b] == 2 for b in later)
            progress = await txmq_cli("admin", "-n", ns, "consumer", "progress", group, "-t", topic)
            assert progress.returncode == 0 and "Total lag: 0" in progress.stdout, progress.stdout
        finally:
            await consumer.shutdown()
        bad = await txmq_cli("admin", "-n", ns, "consumer", "reset-offset", group, topic, "--to", "yesterday")
        assert bad.returncode != 0 and "not earliest, latest" in bad.stderr


async def admin_lag(ns: str, group: str, topic: str) -> int:
    async with Admin(ns) as admin:
        return (await admin.consume_stats(group, topic)).diff_total


async def test_dlq_list_and_resend_through_the_cli(make_cluster: Any) -> None:
    cluster = make_cluster()
    ns = cluster.namesrv_addr
    topic, group = "DlqT", "DlqG"
    async with Admin(ns) as admin:
        await create_topic(admin, cluster.broker_addr, topic, 1)
    attempts: Counter[bytes] = Counter()

    async def failing(msgs: list[Any]) -> ConsumeStatus:
        for m in msgs:
            attempts[m.body] += 1
        raise RuntimeError("payment service down")

    async with Producer("DlqP", ns) as producer, Admin(ns) as admin:
        ids = [(await producer.send(Message(topic, f"d{i}".encode()))).msg_id for i in range(2)]
        # Our client sends its limit with each send-back (request version >= 121), so it beats the group's 16.
        consumer = PushConsumer(
            group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, max_reconsume_times=1
        )
        consumer.subscribe(topic)
        consumer.register_listener(failing)
        await consumer.start()
        try:

            async def both_dead() -> bool:
                return len(await admin.dead_letters(group)) == 2

            await aeventually(both_dead, "both messages in the DLQ", timeout=60)
        finally:
            await consumer.shutdown()
        assert attempts == {b"d0": 2, b"d1": 2}  # the delivery and one retry

        listing = await txmq_cli("admin", "-n", ns, "dlq", "list", group)
        assert listing.returncode == 0, listing.stderr
        for msg_id in ids:
            assert msg_id in listing.stdout
        assert topic in listing.stdout and "limit is 1" in listing.stdout
        assert "payment service down" in listing.stdout and "0 already resent" in listing.stdout

        before = await admin.topic_stats(topic)
        max_before = sum(s.max_offset for s in before.values())
        retry_before = sum(s.max_offset for s in (await admin.topic_stats(f"%RETRY%{group}")).values())
        resend = await txmq_cli("admin", "-n", ns, "dlq", "resend", group, "--id", ids[0])
        assert resend.returncode == 0, resend.stdout + resend.stderr
        assert "1 message(s) put back" in resend.stdout
        again = await txmq_cli("admin", "-n", ns, "dlq", "resend", group, "--id", ids[0])
        assert again.returncode == 0 and "already resent" in again.stdout and "0 message(s) put back" in again.stdout
        rest = await txmq_cli("admin", "-n", ns, "dlq", "resend", group, "--all")
        assert rest.returncode == 0 and "1 message(s) put back" in rest.stdout, rest.stdout
        missing = await txmq_cli("admin", "-n", ns, "dlq", "resend", group, "--id", "NOSUCHID")
        assert missing.returncode == 1 and "not in the DLQ" in missing.stdout
        # Back on the group's retry topic only: the original topic (which other groups read) is untouched.
        after = await admin.topic_stats(topic)
        assert sum(s.max_offset for s in after.values()) == max_before
        retry_after = sum(s.max_offset for s in (await admin.topic_stats(f"%RETRY%{group}")).values())
        assert retry_after == retry_before + 2

        got: list[Any] = []

        async def ok(msgs: list[Any]) -> ConsumeStatus:
            got.extend(msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(group, ns)
        consumer.subscribe(topic)
        consumer.register_listener(ok)
        await consumer.start()
        try:
            await aeventually(lambda: len(got) >= 2, "the resent messages", timeout=60)
            await asyncio.sleep(0.5)
        finally:
            await consumer.shutdown()
        assert sorted(m.msg_id for m in got) == sorted(ids)
        assert all(m.reconsume_times == 0 and m.topic == topic for m in got)
        final = await txmq_cli("admin", "-n", ns, "dlq", "list", group)
        assert "2 already resent" in final.stdout
