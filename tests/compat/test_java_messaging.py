"""The official Java client's sends and consumers against `txmq dev` (lines "v4" = 4.9.8 and "v5" = 5.5.0)."""

from __future__ import annotations

import collections
import time
import uuid
from typing import Any

import pytest

from txmq.client import Message
from txmq.client.sync import Admin, Producer
from txmq.testing import eventually

from .java_client import LINES, JavaProcess, named, run_java
from .test_java_client import bodies, consume

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def create_topics(ns: str, *topics: str) -> None:
    """Topics made before their consumers start: a consumer of a topic with no route asks again only every 30 s."""
    with Admin(ns) as admin:
        for topic in topics:
            admin.create_topic(topic, cluster="DefaultCluster")


def produce(line: str, ns: str, topic: str, mode: str, count: int, *extra: str) -> list[dict]:
    events = run_java(
        line, "produce", "--namesrv", ns, "--topic", topic, "--mode", mode, "--count", str(count),
        "--body-prefix", f"{mode}-", *extra,
    )  # fmt: skip
    assert named(events, "summary") == [{"event": "summary", "failed": 0}], events
    sent = named(events, "sent")
    assert len(sent) == count
    return sent


@pytest.mark.parametrize("line", LINES)
def test_every_send_mode_reaches_a_push_consumer_once(txmq_cluster: Any, line: str) -> None:
    """Sync, async, oneway, batch, orderly (MessageQueueSelector), delay levels, and bodies over 4 KiB (which the
    client compresses), with keys, tags and user properties; one push consumer gets each exactly once, intact."""
    ns = txmq_cluster.namesrv_addr
    topic = _name("JSend")
    common = ("--tag", "TagA", "--keys", "key-{i}", "--prop", "step={i}", "--prop", "kind=java")
    sent = produce(line, ns, topic, "sync", 5, *common)
    assert all(e["status"] == "SEND_OK" and e["msgId"] and e["offsetMsgId"] for e in sent)
    produce(line, ns, topic, "async", 5, *common)
    produce(line, ns, topic, "oneway", 5, *common)
    batch = produce(line, ns, topic, "batch", 5, *common)
    assert len({e["msgId"] for e in batch}) == 5 and len({e["queueId"] for e in batch}) == 1
    orderly = produce(line, ns, topic, "orderly", 8, "--orders", "4", *common)
    queue_of_order = {}
    for e in orderly:
        assert queue_of_order.setdefault(e["order"], e["queueId"]) == e["queueId"]
    delayed = produce(line, ns, topic, "sync", 2, "--delay-level", "2", "--body-prefix", "delayed-", *common)
    big = produce(line, ns, topic, "sync", 2, "--body-size", "6000", "--body-prefix", "big-", *common)
    expected = {f"{mode}-{i}" for mode, n in (("sync", 5), ("async", 5), ("oneway", 5), ("batch", 5)) for i in range(n)}
    expected |= {f"orderly-{i}" for i in range(8)} | {e["body"] for e in delayed} | {e["body"] for e in big}
    received = consume(line, ns, topic, len(expected))
    assert bodies(received) == dict.fromkeys(expected, 1)
    for e in received:
        i = e["body"].split(":")[0].split("-")[1]
        assert e["tags"] == "TagA" and e["keys"] == f"key-{i}", e
        assert e["properties"]["step"] == i and e["properties"]["kind"] == "java", e
        if e["body"].startswith("delayed-"):
            # Level 2 is one second in the test broker's messageDelayLevel.
            assert e["storeTimestamp"] - e["bornTimestamp"] >= 900, e
        if e["body"].startswith("big-"):
            assert e["bodyLength"] == 6000


@pytest.mark.parametrize("line", LINES)
def test_an_oversized_body_is_refused_with_the_clients_usual_exception(txmq_cluster: Any, line: str) -> None:
    """Over the client's own maxMessageSize the client refuses (code 13); a client configured for more meets the
    broker's 4 MiB limit: MQBrokerException with MESSAGE_ILLEGAL (13), and the broker keeps serving."""
    ns = txmq_cluster.namesrv_addr
    topic = _name("JBig")
    events = run_java(line, "produce", "--namesrv", ns, "--topic", topic, "--body-size", str(5 * 1024 * 1024))
    [error] = named(events, "error")
    assert error["type"].endswith("MQClientException") and error["code"] == 13, error
    events = run_java(
        line, "produce", "--namesrv", ns, "--topic", topic, "--body-size", str(5 * 1024 * 1024),
        "--max-message-size", str(8 * 1024 * 1024), "--compress-over", str(64 * 1024 * 1024), "--retries", "0",
    )  # fmt: skip
    [error] = named(events, "error")
    assert error["type"].endswith("MQBrokerException") and error["code"] == 13, error
    assert named(run_java(line, "produce", "--namesrv", ns, "--topic", topic), "sent")[0]["status"] == "SEND_OK"


@pytest.mark.parametrize("line", LINES)
def test_clustering_consumers_share_and_broadcasting_consumers_each_get_all(txmq_cluster: Any, line: str) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("JShare"), _name("JShareCG")
    args = ["--namesrv", ns, "--topic", topic, "--group", group, "--timeout", "40", "--settle", "2000"]
    # Two members of one group share 20 messages.
    create_topics(ns, topic)
    members = [JavaProcess(line, "consume", [*args, "--expect", "20"]) for _ in range(2)]
    for m in members:
        m.wait_event("ready")
    time.sleep(3)  # both members rebalance (NOTIFY_CONSUMER_IDS_CHANGED) onto two queues each
    produce(line, ns, topic, "sync", 20)
    eventually(lambda: sum(len(m.named("received")) for m in members) >= 20, "20 receptions", timeout=60)
    for m in members:
        m.kill()
    seen = [bodies(m.named("received")) for m in members]
    # Clustering is at least once, as on RocketMQ: a message pulled by one member while its queue moves to the other
    # (a rebalance that a loaded machine makes late) can reach both. Nothing is lost, and no member sees one twice.
    assert set(sum(seen, collections.Counter())) == {f"sync-{i}" for i in range(20)}
    assert all(max(s.values()) == 1 for s in seen), seen
    assert all(seen), seen  # each member got its share

    # Broadcasting: every member gets every message.
    topic, group = _name("JBroad"), _name("JBroadCG")
    args = ["--namesrv", ns, "--topic", topic, "--group", group, "--model", "BROADCASTING", "--expect", "10"]
    create_topics(ns, topic)
    members = [JavaProcess(line, "consume", [*args, "--instance", f"b{n}"]) for n in range(2)]
    for m in members:
        m.wait_event("ready")
    time.sleep(2)
    produce(line, ns, topic, "sync", 10)
    for m in members:
        assert bodies(named(m.finish(150), "received")) == dict.fromkeys((f"sync-{i}" for i in range(10)), 1)


@pytest.mark.parametrize("line", LINES)
def test_orderly_consumer_sees_each_order_in_sequence(txmq_cluster: Any, line: str) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = _name("JOrder")
    produce(line, ns, topic, "orderly", 24, "--orders", "4")
    received = consume(line, ns, topic, 24, "--listener", "orderly")
    assert bodies(received) == dict.fromkeys((f"orderly-{i}" for i in range(24)), 1)
    per_order: dict[str, list[int]] = collections.defaultdict(list)
    for e in received:
        per_order[e["properties"]["order"]].append(int(e["body"].split("-")[1]))
    assert len(per_order) == 4
    for steps in per_order.values():
        assert steps == sorted(steps), per_order


def test_reconsume_later_retries_then_dead_letters(txmq_cluster: Any) -> None:
    """RECONSUME_LATER: redelivered through %RETRY%group with reconsumeTimes counting up, then to %DLQ%group after
    maxReconsumeTimes (2 here)."""
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("JRetry"), _name("JRetryCG")
    produce("v4", ns, topic, "sync", 3)
    received = consume("v4", ns, topic, 5, "--fail-body", "sync-1", "--max-reconsume", "2", group=group)
    attempts = [e["reconsumeTimes"] for e in received if e["body"] == "sync-1"]
    assert attempts == [0, 1, 2], received
    assert bodies(received) == {"sync-0": 1, "sync-1": 3, "sync-2": 1}
    with Admin(ns) as admin:
        dead = eventually(lambda: admin.dead_letters(group), "the message in the DLQ", timeout=20, interval=0.5)
    assert len(dead) == 1, dead


@pytest.mark.parametrize("line", LINES)
def test_lite_pull_consumer_subscribe_and_assign(txmq_cluster: Any, line: str) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = _name("JLite")
    produce(line, ns, topic, "sync", 12)
    expected = dict.fromkeys((f"sync-{i}" for i in range(12)), 1)
    for mode in ((), ("--assign",)):
        events = JavaProcess(
            line, "lite-pull", ["--namesrv", ns, "--topic", topic, "--group", _name("JLiteCG"), "--expect", "12", *mode]
        ).finish(90)
        assert bodies(named(events, "received")) == expected, mode


def test_consume_from_timestamp_and_tag_filters(txmq_cluster: Any) -> None:
    """CONSUME_FROM_TIMESTAMP: on a young queue a new group starts at offset 0 whatever ConsumeFromWhere says, as
    with RocketMQ's broker (queryConsumerOffset answers 0 while the queue's first message is in memory); the
    timestamp itself is searched (SEARCH_OFFSET_BY_TIMESTAMP) by offsetForTimestamp. A tag expression "TagA || TagC"
    gets only those tags."""
    ns = txmq_cluster.namesrv_addr
    topic = _name("JWhen")
    # Four of each: one per queue. SEARCH_OFFSET_BY_TIMESTAMP answers the entry whose store time is nearest
    # (RocketMQ 4.9's getOffsetInQueueByTime), so the instant must be much nearer the new ones than the old ones:
    # the new ones are sent at once by txmq's client (a JVM's start-up on a loaded machine took longer than the
    # 2 s gap, and the old ones came out nearer).
    produce("v4", ns, topic, "sync", 4, "--body-prefix", "old-")
    time.sleep(2.0)
    since = time.time()
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(since - 1))
    time.sleep(0.3)
    with Producer(_name("JWhenPG"), ns) as producer:
        queues = producer.fetch_publish_queues(topic)
        assert len(queues) == 4
        for i, mq in enumerate(queues):
            producer.send(Message(topic, f"new-{i}".encode()), queue=mq)
    new = dict.fromkeys((f"new-{i}" for i in range(4)), 1)
    everything = {**dict.fromkeys((f"old-{i}" for i in range(4)), 1), **new}
    assert bodies(consume("v4", ns, topic, 8, "--from", "timestamp", "--timestamp", stamp)) == everything
    for line in LINES:
        events = JavaProcess(
            line, "lite-pull",
            ["--namesrv", ns, "--topic", topic, "--group", _name("JLiteTs"), "--expect", "4", "--assign",
             "--seek-timestamp", str(int(since * 1000))],
        ).finish(90)  # fmt: skip
        assert bodies(named(events, "received")) == new, line

    topic = _name("JTags")
    for tag in ("TagA", "TagB", "TagC"):
        produce("v5", ns, topic, "sync", 2, "--tag", tag, "--body-prefix", f"{tag}-")
    received = consume("v5", ns, topic, 4, "--tags", "TagA || TagC")
    assert bodies(received) == dict.fromkeys(("TagA-0", "TagA-1", "TagC-0", "TagC-1"), 1)
