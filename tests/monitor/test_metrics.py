"""``/metrics`` of a real ``txmq dev`` process under txmq's own client, parsed with prometheus_client's parser:
counters move by exactly what was sent, consumed, committed and rolled back, and lag matches the offsets."""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from txmq.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from txmq.testing import aeventually

FAST = {"rebalance_interval": 1.0, "poll_name_server_interval": 2.0, "heartbeat_interval": 2.0}


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by name: [(labels, value)]."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels`` (0 when there is none)."""
    found = [v for got, v in samples.get(name, []) if all(got.get(k) == want for k, want in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else 0.0


async def make_topic(admin: Admin, broker_addr: str, topic: str, queues: int) -> None:
    await admin.create_topic(topic, broker_addr=broker_addr, read_queue_nums=queues, write_queue_nums=queues)

    async def routed() -> bool:
        try:
            return bool((await admin.topic_route(topic)).broker_datas)
        except Exception:
            return False

    await aeventually(routed, f"a route for {topic}", timeout=60)


class Decide:
    """Commits bodies starting with c, rolls back the others."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT if message.body.startswith(b"c") else LocalTransactionState.ROLLBACK

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return self.execute_local_transaction(message, None)


async def test_metrics_move_by_what_was_sent_consumed_committed_and_rolled_back(make_cluster: Any) -> None:
    cluster = make_cluster({"transactionTimeOut": "1000", "transactionCheckInterval": "1000"})
    ns, url = cluster.namesrv_addr, cluster.metrics_url
    topic, group, dlq_group = "MetricsT", "MetricsG", "MetricsDlqG"
    before = await asyncio.to_thread(scrape, url)
    assert value(before, "rocketmq_messages_in_total", topic=topic) == 0
    base = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a"}
    assert value(before, "rocketmq_half_messages", **base) == 0

    async with Admin(ns) as admin:
        await make_topic(admin, cluster.broker_addr, topic, 4)
        await make_topic(admin, cluster.broker_addr, "MetricsDlqT", 1)
        async with Producer("MetricsP", ns) as producer:
            sent = [await producer.send(Message(topic, b"m" * (100 + i))) for i in range(40)]
        assert all(r.ok for r in sent) if hasattr(sent[0], "ok") else len(sent) == 40
        async with TransactionProducer("MetricsTP", ns, Decide(), **FAST) as tp:
            for body in (b"c1", b"c2", b"c3", b"r1", b"r2"):
                await tp.send_message_in_transaction(Message(topic, body), None)

        async def decided() -> bool:
            s = await asyncio.to_thread(scrape, url)
            return value(s, "rocketmq_commit_messages_total") == 3 and value(s, "rocketmq_rollback_messages_total") == 2

        await aeventually(decided, "3 commits and 2 rollbacks in /metrics", timeout=30)
        mid = await asyncio.to_thread(scrape, url)
        assert value(mid, "rocketmq_messages_in_total", topic=topic, is_system="false") == 43  # 40 + 3 committed
        assert value(mid, "txmq_transaction_half_messages_total") == 5
        assert value(mid, "rocketmq_half_messages") == 0
        assert value(mid, "rocketmq_messages_in_total", topic="RMQ_SYS_TRANS_HALF_TOPIC", is_system="true") == 5
        bytes_in = value(mid, "rocketmq_throughput_in_total", topic=topic)

        # Consume everything once: messages and bytes out equal what came in.
        got: list[MessageExt] = []

        async def ok(msgs: list[MessageExt]) -> ConsumeStatus:
            got.extend(msgs)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(
            group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, instance_name="metrics-c", **FAST
        )
        consumer.subscribe(topic)
        consumer.register_listener(ok)
        await consumer.start()
        try:
            await aeventually(lambda: len(got) >= 43, "43 messages consumed", timeout=60)
            live = await asyncio.to_thread(scrape, url)
            conns = [v for lab, v in live["rocketmq_consumer_connections"] if lab["consumer_group"] == group]
            assert conns == [1.0]
            assert value(live, "rocketmq_consumer_connections", consumer_group=group, language="PYTHON") == 1
        finally:
            await consumer.shutdown()  # persists the consumed offsets
        assert len(got) == 43
        assert sum(m.store_size for m in got) == bytes_in
        # Seven more while nobody consumes: lag and ready 7, nothing in flight.
        async with Producer("MetricsP", ns) as producer:
            for i in range(7):
                await producer.send(Message(topic, f"late-{i}".encode()))

        stats = await admin.consume_stats(group, topic)

        async def settled() -> bool:
            s = await asyncio.to_thread(scrape, url)
            return value(s, "rocketmq_consumer_lag_messages", topic=topic, consumer_group=group) == 7

        await aeventually(settled, "lag 7", timeout=30)
        after = await asyncio.to_thread(scrape, url)
        stats = await admin.consume_stats(group, topic)
        assert stats.diff_total == 7
        assert value(after, "rocketmq_consumer_lag_messages", topic=topic, consumer_group=group) == stats.diff_total
        assert value(after, "rocketmq_consumer_ready_messages", topic=topic, consumer_group=group) == 7
        assert value(after, "rocketmq_consumer_inflight_messages", topic=topic, consumer_group=group) == 0
        assert value(after, "rocketmq_messages_out_total", topic=topic, consumer_group=group) == 43
        assert value(after, "rocketmq_throughput_out_total", topic=topic, consumer_group=group) == bytes_in
        assert value(after, "rocketmq_messages_in_total", topic=topic) == 50

        # Two messages to the DLQ of a group that always fails (one retry each).
        attempts: Counter[bytes] = Counter()

        async def failing(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                attempts[m.body] += 1
            return ConsumeStatus.RECONSUME_LATER

        async with Producer("MetricsP", ns) as producer:
            for i in range(2):
                await producer.send(Message("MetricsDlqT", f"d{i}".encode()))
        consumer = PushConsumer(
            dlq_group, ns, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, max_reconsume_times=1, **FAST
        )
        consumer.subscribe("MetricsDlqT")
        consumer.register_listener(failing)
        await consumer.start()
        try:

            async def dead() -> bool:
                s = await asyncio.to_thread(scrape, url)
                return value(s, "rocketmq_send_to_dlq_messages_total", consumer_group=dlq_group) == 2

            await aeventually(dead, "2 messages sent to the DLQ", timeout=60)
        finally:
            await consumer.shutdown()

    final = await asyncio.to_thread(scrape, url)
    # Every request code the client used is timed; each histogram's +Inf bucket equals its count.
    latency = {lab["request_code"] for lab, _ in final["rocketmq_rpc_latency_count"]}
    assert {"send_message_v2", "pull_message", "end_transaction", "heart_beat"} <= latency
    for lab, n in final["rocketmq_rpc_latency_count"]:
        inf = [
            v
            for l2, v in final["rocketmq_rpc_latency_bucket"]
            if l2["le"] == "+Inf" and all(l2[k] == lab[k] for k in lab)
        ]
        assert inf == [n]
    ends = [lab for lab, _ in final["rocketmq_rpc_latency_count"] if lab["request_code"] == "end_transaction"]
    assert all(lab["result"] == "oneway" for lab in ends)
    flushes = value(final, "txmq_storage_flush_latency_seconds_count")
    assert flushes > 0 and value(final, "txmq_storage_flush_latency_seconds_bucket", le="+Inf") == flushes
    assert len(final["txmq_storage_group_commit_waits_total"]) == 1  # exported (how it counts: tests/store)
    assert value(final, "rocketmq_storage_size", storage_type="local") > 0
    assert value(final, "rocketmq_storage_flush_behind_bytes") == 0  # SYNC_FLUSH: acknowledged means fsynced
    assert value(final, "txmq_connections", protocol_type="remoting") >= 0
