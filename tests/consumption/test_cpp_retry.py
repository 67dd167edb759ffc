"""The official C++ push consumer rejects a message: the broker redelivers it after the retry delays, then DLQs it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from compat.cpp_client import cpp_processes
from txmq.client import Admin, Message, Producer
from txmq.testing import aeventually

from .test_offsets_dlq import create_group, create_topic

pytestmark = pytest.mark.slow

RETRY_MAX = 2


@pytest.fixture
def cpp() -> Any:
    with cpp_processes() as start:
        yield start


async def test_cpp_consumer_failures_are_retried_then_dead_lettered(make_cluster: Any, cpp: Any) -> None:
    cluster = make_cluster()  # TEST_BROKER_CONF: every delay level is 1 s
    ns = cluster.namesrv_addr
    topic, group = "CppRetryT", "CppRetryG"
    # The C++ client (request version 63 < 121) does not send a limit: the group's retryMaxTimes applies.
    await create_group(cluster.broker_addr, group, retry_max_times=RETRY_MAX)
    async with Admin(ns) as admin:
        await create_topic(admin, cluster.broker_addr, topic, 1)
        # C++ learns routes of topics created after it started only ~30 s later: make the retry topic first.
        await create_topic(admin, cluster.broker_addr, f"%RETRY%{group}", 1)
        consumer = cpp(
            ["consume", "--namesrv", ns, "--topic", topic, "--group", group, "--fail-all", "--timeout", "90"]
        )
        consumer.wait_for("started", timeout=30)
        await asyncio.sleep(1.0)  # let its first pull reach the broker
        async with Producer("CppRetryP", ns) as producer:
            sent = await producer.send(Message(topic, b"charge-42"))

        def deliveries() -> list[dict[str, Any]]:
            return [e for e in consumer.received() if e["body"] == "charge-42"]

        await aeventually(
            lambda: any(e["reconsume_times"] == RETRY_MAX for e in deliveries()), "the last retry", timeout=60
        )

        async def dead() -> bool:
            return len(await admin.dead_letters(group)) == 1

        await aeventually(dead, "the message in the DLQ", timeout=30)
        await asyncio.sleep(1.5)  # any further (wrong) delivery would come within one delay level
        consumer.stop()
        got = deliveries()
        assert [e["reconsume_times"] for e in got] == list(range(RETRY_MAX + 1))
        assert all(e["identity"] == sent.msg_id and e["topic"] == topic for e in got)
        assert all(not e["accepted"] for e in got)
        # Redelivered after the delay (level 3 + n, 1 s each here), never before.
        for earlier, later in itertools.pairwise(got):
            assert later["store_timestamp"] - earlier["store_timestamp"] >= 1000
            assert later["properties"].get("RETRY_TOPIC") == topic
        (letter,) = await admin.dead_letters(group)
        assert letter["msgId"] == sent.msg_id and letter["originTopic"] == topic
        assert letter["reconsumeTimes"] == RETRY_MAX + 1
        assert f"limit is {RETRY_MAX}" in letter["reason"]
        assert letter["originMsgId"] == sent.offset_msg_id
