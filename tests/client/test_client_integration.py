"""txmq.client against a real ``txmq dev`` name server and broker (the session ``txmq_cluster`` fixture).

Every test uses its own topics and groups, so they share one cluster. Waits are condition polls with generous
caps, never timing assertions.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from listeners import Collector
from txmq.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
    sync,
)
from txmq.testing import aeventually

pytestmark = pytest.mark.slow

# Fast timers so rebalancing (and the retry topic's late route) settle in about a second.
FAST = {"rebalance_interval": 1.0, "poll_name_server_interval": 2.0}


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cluster(txmq_cluster: Any) -> Any:
    return txmq_cluster


@pytest.fixture
async def admin(cluster: Any) -> AsyncIterator[Admin]:
    async with Admin(cluster.namesrv_addr, instance_name=unique("admin")) as a:
        yield a


async def make_topic(admin: Admin, queues: int = 4) -> str:
    """A new topic on every broker of the cluster, once the name server routes it."""
    topic = unique("T")
    info = await admin.cluster_info()
    (cluster_name,) = info.clusters
    await admin.create_topic(topic, cluster=cluster_name, read_queue_nums=queues, write_queue_nums=queues)
    await aeventually(lambda: admin.topic_route(topic), f"a route for topic {topic}", timeout=15, retry_on=(Exception,))
    return topic


async def test_every_send_mode_is_consumed_exactly_once_by_a_clustered_group(cluster: Any, admin: Admin) -> None:
    topic = await make_topic(admin, queues=4)
    group = unique("G")
    collectors = [Collector(), Collector()]
    consumers = []
    for col in collectors:
        c = PushConsumer(group, cluster.namesrv_addr, instance_name=unique("c"), **FAST)
        c.subscribe(topic)
        c.register_listener(col)
        await c.start()
        consumers.append(c)
    all_queues = {
        MessageQueue(topic, b.broker_name, i) for b in (await admin.topic_route(topic)).broker_datas for i in range(4)
    }
    try:

        def split_settled() -> bool:
            mine = [{q for q in c.assigned_queues() if q.topic == topic} for c in consumers]
            return not (mine[0] & mine[1]) and mine[0] | mine[1] == all_queues and all(mine)

        await aeventually(split_settled, "the two consumers to split the queues", timeout=20)
        sent: list[bytes] = []
        async with Producer(unique("PG"), cluster.namesrv_addr, instance_name=unique("p")) as producer:
            for i in range(10):
                body = f"sync-{i}".encode()
                result = await producer.send(Message(topic, body, tags="A"))
                assert result.status is SendStatus.SEND_OK and result.msg_id
                sent.append(body)
            tasks = [producer.send_async(Message(topic, f"async-{i}".encode())) for i in range(10)]
            await asyncio.gather(*tasks)
            sent += [f"async-{i}".encode() for i in range(10)]
            for i in range(10):
                await producer.send_oneway(Message(topic, f"oneway-{i}".encode()))
                sent.append(f"oneway-{i}".encode())
            batch = [Message(topic, f"batch-{i}".encode(), keys=[f"bk{i}"]) for i in range(10)]
            result = await producer.send_batch(batch)
            assert len(result.msg_id.split(",")) == 10
            sent += [m.body for m in batch]
            for i in range(10):
                await producer.send_orderly(Message(topic, f"orderly-{i}".encode()), "one-key")
                sent.append(f"orderly-{i}".encode())
            big = b"compress-me " * 1000
            await producer.send(Message(topic, big))
            sent.append(big)

        def received() -> list[bytes]:
            return collectors[0].bodies() + collectors[1].bodies()

        await aeventually(lambda: len(received()) >= len(sent), "every message", timeout=30)
        await asyncio.sleep(0.3)  # room for a duplicate to show up, if there were one
        counts = Counter(received())
        assert set(counts) == set(sent)
        assert [b for b, n in counts.items() if n > 1] == []
        for c, col in zip(consumers, collectors, strict=True):
            owned = set(c.assigned_queues())
            assert all(m.queue in owned for m in col.messages)  # nobody read the other's queues
    finally:
        for c in consumers:
            await c.shutdown()
    stats = await admin.consume_stats(group, topic)
    assert stats.diff_total == 0 and sum(w.broker_offset for w in stats.offset_table.values()) == len(sent)


async def test_orderly_listener_sees_each_key_in_order(cluster: Any, admin: Admin) -> None:
    topic = await make_topic(admin, queues=4)
    seen: dict[str, list[int]] = {}
    suspended: list[str] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        with lock:
            for m in msgs:
                key, _, n = m.body.decode().partition(":")
                if key == "k1" and n == "3" and not suspended:
                    suspended.append(m.msg_id)
                    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT  # retried in place, not reordered
                seen.setdefault(key, []).append(int(n))
        return ConsumeOrderlyStatus.SUCCESS

    c = PushConsumer(
        unique("OG"), cluster.namesrv_addr, instance_name=unique("c"), suspend_current_queue_time=0.05, **FAST
    )
    c.subscribe(topic)
    c.register_listener(listener, orderly=True)
    await c.start()
    try:
        async with Producer(unique("PG"), cluster.namesrv_addr) as producer:
            for n in range(10):
                for key in ("k0", "k1", "k2", "k3", "k4"):
                    await producer.send_orderly(Message(topic, f"{key}:{n}".encode()), key)
        await aeventually(lambda: sum(map(len, seen.values())) == 50, "all 50 messages", timeout=30)
    finally:
        await c.shutdown()
    assert suspended
    assert seen == {k: list(range(10)) for k in ("k0", "k1", "k2", "k3", "k4")}


async def test_broadcasting_delivers_everything_to_every_consumer(cluster: Any, admin: Admin, tmp_path: Path) -> None:
    topic = await make_topic(admin, queues=2)
    group = unique("BG")
    collectors = [Collector(), Collector()]
    consumers = []
    for i, col in enumerate(collectors):
        c = PushConsumer(
            group,
            cluster.namesrv_addr,
            instance_name=f"b{i}",
            message_model=MessageModel.BROADCASTING,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            offset_store_dir=tmp_path,
            **FAST,
        )
        c.subscribe(topic)
        c.register_listener(col)
        await c.start()
        consumers.append(c)
    try:
        async with Producer(unique("PG"), cluster.namesrv_addr) as producer:
            for i in range(12):
                await producer.send(Message(topic, f"b-{i}".encode()))
        for col in collectors:
            await aeventually(lambda col=col: len(col.bodies()) >= 12, "every message at every consumer", timeout=30)
        await asyncio.sleep(0.2)
        for col in collectors:
            assert sorted(col.bodies()) == sorted(f"b-{i}".encode() for i in range(12))
    finally:
        for c in consumers:
            await c.shutdown()
    assert (tmp_path / f"{group}@b0.json").exists() and (tmp_path / f"{group}@b1.json").exists()


async def test_tag_filtering_push_and_pull(cluster: Any, admin: Admin) -> None:
    topic = await make_topic(admin, queues=2)
    col = Collector()
    c = PushConsumer(unique("TG"), cluster.namesrv_addr, instance_name=unique("c"), **FAST)
    c.subscribe(topic, "TagA || TagC")
    c.register_listener(col)
    await c.start()
    try:
        async with Producer(unique("PG"), cluster.namesrv_addr) as producer:
            for i, tag in enumerate(["TagA", "TagB", "TagC", None, "TagA", "TagB"]):
                await producer.send(Message(topic, f"{tag}-{i}".encode(), tags=tag))
        await aeventually(lambda: len(col.bodies()) >= 3, "the three matching messages", timeout=30)
        await asyncio.sleep(0.2)
        assert sorted(col.bodies()) == [b"TagA-0", b"TagA-4", b"TagC-2"]
    finally:
        await c.shutdown()
    async with PullConsumer(unique("PC"), cluster.namesrv_addr) as pc:
        got = []
        for mq in await pc.fetch_queues(topic):
            result = await pc.pull(mq, "TagB", 0, 32)
            got += [m.body for m in result.messages]
        assert sorted(got) == [b"TagB-1", b"TagB-5"]


async def test_pull_consumer_reads_every_queue_and_keeps_offsets(cluster: Any, admin: Admin) -> None:
    topic = await make_topic(admin, queues=2)
    group = unique("PCG")
    before = int(time.time() * 1000)
    async with Producer(unique("PG"), cluster.namesrv_addr) as producer:
        sent = [f"p-{i}".encode() for i in range(20)]
        for body in sent:
            await producer.send(Message(topic, body))
        async with PullConsumer(group, cluster.namesrv_addr) as pc:
            queues = await pc.fetch_queues(topic)
            assert len(queues) == 2
            got: list[bytes] = []
            for mq in queues:
                offset = await pc.min_offset(mq)
                top = await pc.max_offset(mq)
                while offset < top:
                    result = await pc.pull(mq, "*", offset, 4)
                    assert result.status is PullStatus.FOUND and len(result.messages) <= 4
                    assert [m.queue_offset for m in result.messages] == list(range(offset, result.next_begin_offset))
                    got += [m.body for m in result.messages]
                    offset = result.next_begin_offset
                empty = await pc.pull(mq, "*", offset)
                assert empty.status is PullStatus.NO_NEW_MSG and empty.messages == []
                assert await pc.search_offset(mq, before) == 0
                assert await pc.earliest_msg_store_time(mq) >= before - 1000
            assert sorted(got) == sorted(sent)
            illegal = await pc.pull(queues[0], "*", 10_000)
            assert illegal.status is PullStatus.OFFSET_ILLEGAL

            # A long poll parked at the end of queue 0 returns as soon as a message lands there.
            mq0 = queues[0]
            end = await pc.max_offset(mq0)
            waiting = asyncio.ensure_future(pc.pull_blocking(mq0, "*", end))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await producer.send(Message(topic, b"wake-up"), queue=mq0)
            woke = await asyncio.wait_for(waiting, 20)
            assert woke.status is PullStatus.FOUND and [m.body for m in woke.messages] == [b"wake-up"]

            await pc.update_offset(mq0, end + 1)
        # Shutdown committed it; a new consumer of the group reads it back from the broker.
        async with PullConsumer(group, cluster.namesrv_addr, instance_name=unique("pc2")) as pc2:
            assert await pc2.fetch_offset(mq0) == end + 1


async def test_rejected_message_comes_back(cluster: Any, admin: Admin) -> None:
    topic = await make_topic(admin, queues=1)
    deliveries: list[MessageExt] = []
    lock = threading.Lock()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        with lock:
            deliveries.extend(msgs)
            first_time = sum(1 for d in deliveries if d.msg_id == msgs[0].msg_id) == 1
        return ConsumeStatus.RECONSUME_LATER if first_time else ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(unique("RG"), cluster.namesrv_addr, instance_name=unique("c"), **FAST)
    c.subscribe(topic)
    c.register_listener(listener)
    await c.start()
    try:
        async with Producer(unique("PG"), cluster.namesrv_addr) as producer:
            result = await producer.send(Message(topic, b"try-again", tags="T1"))
        await aeventually(lambda: len(deliveries) >= 2, "the redelivery", timeout=60)
    finally:
        await c.shutdown()
    first, again = deliveries[0], deliveries[1]
    assert first.msg_id == again.msg_id == result.msg_id
    assert again.body == b"try-again" and again.tags == "T1"
    assert again.topic == topic  # a message from %RETRY%<group> shows its original topic
    assert again.reconsume_times >= 1


async def test_admin_queries(cluster: Any, admin: Admin) -> None:
    topic = await make_topic(admin, queues=3)
    assert topic in await admin.topic_list()
    info = await admin.cluster_info()
    assert cluster.broker_addr in info.master_addrs()
    runtime = await admin.broker_runtime_info(cluster.broker_addr)
    assert runtime["brokerVersionDesc"] and int(runtime["commitLogMaxOffset"]) >= 0
    everywhere = await admin.cluster_runtime_info()
    assert everywhere[cluster.broker_addr]["brokerVersionDesc"] == runtime["brokerVersionDesc"]
    route = await admin.topic_route(topic)
    assert [q.write_queue_nums for q in route.queue_datas] == [3]
    async with Producer(unique("PG"), cluster.namesrv_addr) as producer:
        results = [
            await producer.send(Message(topic, f"q-{i}".encode(), keys=[f"key-{i}", "shared"])) for i in range(5)
        ]
    by_offset = await admin.view_message(results[2].offset_msg_id)
    assert by_offset.body == b"q-2" and by_offset.msg_id == results[2].msg_id
    by_uniq = await admin.view_message(results[3].msg_id, topic)
    assert by_uniq.body == b"q-3" and by_uniq.offset_msg_id == results[3].offset_msg_id
    assert [m.body for m in await admin.query_message_by_key(topic, "key-4")] == [b"q-4"]
    assert sorted(m.body for m in await admin.query_message_by_key(topic, "shared")) == [
        f"q-{i}".encode() for i in range(5)
    ]
    stats = await admin.topic_stats(topic)
    assert len(stats) == 3 and sum(s.max_offset for s in stats.values()) == 5

    group = unique("AG")
    col = Collector()
    c = PushConsumer(group, cluster.namesrv_addr, instance_name=unique("c"), **FAST)
    c.subscribe(topic)
    c.register_listener(col)
    await c.start()
    try:
        await aeventually(lambda: len(col.bodies()) == 5, "the five messages", timeout=30)
        assert c.client_id in await admin.consumer_ids(group)
        connections = await admin.consumer_connections(group)
        assert c.client_id in {x["clientId"] for x in connections["connectionSet"]}
    finally:
        await c.shutdown()
    consume = await admin.consume_stats(group, topic)
    assert consume.diff_total == 0
    assert {mq.queue_id for mq in consume.offset_table if mq.topic == topic} == {0, 1, 2}


def test_blocking_clients_round_trip(cluster: Any) -> None:
    with sync.Admin(cluster.namesrv_addr) as admin:
        topic = unique("ST")
        (cluster_name,) = admin.cluster_info().clusters
        admin.create_topic(topic, cluster=cluster_name, read_queue_nums=2, write_queue_nums=2)
        for _ in itertools.count():
            try:
                admin.topic_route(topic)
                break
            except Exception:
                time.sleep(0.05)
    got: list[bytes] = []
    done = threading.Event()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.extend(m.body for m in msgs)
        if len(got) >= 5:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer_ = sync.PushConsumer(unique("SG"), cluster.namesrv_addr, instance_name=unique("c"), **FAST)
    consumer_.subscribe(topic)
    consumer_.register_listener(listener)
    with consumer_, sync.Producer(unique("SP"), cluster.namesrv_addr) as producer:
        for i in range(5):
            producer.send(Message(topic, f"s-{i}".encode()))
        assert done.wait(30)
    assert sorted(got) == [f"s-{i}".encode() for i in range(5)]


async def test_request_gets_a_reply_from_the_consuming_service(cluster: Any, admin: Admin) -> None:
    """Request-reply: ``Producer.request`` waits for the reply a consumer sends with ``create_reply`` (the broker
    pushes it to the requester's connection); a request nobody answers times out."""
    from txmq.client.request_reply import create_reply
    from txmq.errors import RequestTimeoutError

    topic = await make_topic(admin, queues=2)
    ns = cluster.namesrv_addr
    async with Producer(unique("RepPG"), ns, instance_name=unique("rp")) as replier:

        async def answer(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                await replier.send(create_reply(m, b"re:" + m.body))
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(unique("RepG"), ns, instance_name=unique("rc"), **FAST)
        consumer.subscribe(topic)
        consumer.register_listener(answer)
        async with consumer, Producer(unique("ReqPG"), ns, instance_name=unique("rq")) as requester:
            replies = [await requester.request(Message(topic, f"ask-{i}".encode()), timeout=20) for i in range(3)]
            assert [r.body for r in replies] == [b"re:ask-0", b"re:ask-1", b"re:ask-2"]
            assert {r.topic for r in replies} == {"DefaultCluster_REPLY_TOPIC"}
            assert all(r.properties["MSG_TYPE"] == "reply" and "ARRIVE_TIME" in r.properties for r in replies)
            # Concurrent requests each get their own reply.
            many = await asyncio.gather(*(requester.request(Message(topic, b"n%d" % i), timeout=20) for i in range(8)))
            assert sorted(r.body for r in many) == sorted(b"re:n%d" % i for i in range(8))

    silent = await make_topic(admin, queues=1)
    async with Producer(unique("ReqPG"), ns, instance_name=unique("rq2")) as requester:
        with pytest.raises(RequestTimeoutError, match="no reply came"):
            await requester.request(Message(silent, b"anyone?"), timeout=1.5)
