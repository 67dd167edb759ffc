"""The official RocketMQ 5.x Python client (``rocketmq-python-client==5.1.2``, gRPC) against ``txmq dev``.

Each client runs in its own process from ``.venv-py5`` (tests/compat/py5_driver.py prints what it saw); the broker
is a real child process; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.acl.acl_support import BASE_ACL, PUB_KEY, PUB_SECRET, SUB_KEY, SUB_SECRET, TOPIC, start_acl_cluster
from tests.cluster_harness import DevCluster
from tests.compat.conftest import GRPC_CONF

from txmq.client import Message, PullConsumer, PullStatus
from txmq.client.sync import Admin, Producer
from txmq.net import connect
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import eventually

from .py5_client import of, run_py5

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def produce(cluster: DevCluster, topic: str, count: int, *extra: str) -> list[dict[str, Any]]:
    events = run_py5(["produce", "--endpoints", cluster.grpc_endpoint, "--topic", topic, "--count", count, *extra])
    assert of(events, "summary") == [{"event": "summary", "sent": count, "failed": 0}], events
    return of(events, "sent")


def receive(cluster: DevCluster, topic: str, group: str, *extra: str, timeout: float = 60) -> list[dict[str, Any]]:
    events = run_py5(
        ["receive", "--endpoints", cluster.grpc_endpoint, "--topic", topic, "--group", group, *extra], timeout
    )
    assert not of(events, "ack_failed"), events
    return of(events, "received")


def push(cluster: DevCluster, topic: str, group: str, *extra: str) -> list[dict[str, Any]]:
    events = run_py5(
        ["push", "--endpoints", cluster.grpc_endpoint, "--topic", topic, "--group", group, *extra], timeout=60
    )
    return of(events, "consumed")


def dead_letters(cluster: DevCluster, group: str) -> list[dict[str, Any]]:
    """``%DLQ%<group>`` through txmq's admin (waits until something is there)."""

    def rows() -> list[dict[str, Any]]:
        with Admin(cluster.namesrv_addr) as admin:
            return admin.dead_letters(group)

    return eventually(rows, f"a message reaches %DLQ%{group}", timeout=30)


def create_group(cluster: DevCluster, group: str, retry_max_times: int, *, orderly: bool = False) -> None:
    async def main() -> None:
        conn = await connect("127.0.0.1", cluster.broker_port)
        try:
            body = orjson.dumps(
                {"groupName": group, "retryMaxTimes": retry_max_times, "consumeMessageOrderly": orderly}
            )
            cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
            resp = await conn.request(cmd, timeout=5)
            assert resp.code == 0, resp.remark
        finally:
            conn.close()

    asyncio.run(main())


def pull_everything(cluster: DevCluster, topic: str) -> list[Any]:
    """Every message of ``topic``, read through the 4.x door by txmq's own PullConsumer."""

    async def pull_all() -> list[Any]:
        out: list[Any] = []
        async with PullConsumer(_name("reader"), cluster.namesrv_addr) as reader:
            for mq in await reader.fetch_queues(topic):
                result = await reader.pull(mq, "*", 0, 32)
                if result.status is PullStatus.FOUND:
                    out.extend(result.messages)
        return out

    return asyncio.run(pull_all())


def test_normal_messages_are_received_once_with_their_properties(grpc_cluster: DevCluster) -> None:
    topic, group = _name("T5"), _name("G5")
    sent = produce(grpc_cluster, topic, 6, "--tag", "TagA")
    got = receive(grpc_cluster, topic, group, "--expect", "6", "--seconds", "20")
    assert sorted(e["id"] for e in got) == sorted(e["id"] for e in sent)
    by_id = {e["id"]: e for e in got}
    for s in sent:
        r = by_id[s["id"]]
        assert (r["body"], r["tag"], r["topic"], r["attempt"]) == (s["body"], "TagA", topic, 1)
        assert r["keys"] == [f"key-{s['index']}"] and r["properties"]["index"] == str(s["index"])
    # Acked: the group sees nothing more.
    assert receive(grpc_cluster, topic, group, "--seconds", "3") == []


def test_tag_filter(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TF"), _name("GF")
    produce(grpc_cluster, topic, 2, "--tag", "keep", "--body-prefix", "keep-")
    produce(grpc_cluster, topic, 2, "--tag", "drop", "--body-prefix", "drop-")
    got = receive(grpc_cluster, topic, group, "--tag-expression", "keep", "--expect", "2", "--seconds", "6")
    assert sorted(e["body"] for e in got) == ["keep-0", "keep-1"]


def test_fifo_messages_of_a_group_share_a_queue_and_keep_their_order(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TFifo"), _name("GFifo")
    sent = produce(grpc_cluster, topic, 9, "--message-group", "order-{k}")
    got = receive(grpc_cluster, topic, group, "--expect", "9", "--seconds", "20")
    assert sorted(e["id"] for e in got) == sorted(e["id"] for e in sent)
    assert {e["group"] for e in got} == {"order-0", "order-1", "order-2"}
    for k in range(3):
        bodies = [e["body"] for e in got if e["group"] == f"order-{k}"]
        assert bodies == [f"m-{i}" for i in range(9) if i % 3 == k]


def test_delayed_message_is_not_delivered_before_its_time(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TDelay"), _name("GDelay")
    sent = produce(grpc_cluster, topic, 1, "--delay-ms", "2500")
    got = receive(grpc_cluster, topic, group, "--expect", "1", "--seconds", "20")
    assert [e["id"] for e in got] == [sent[0]["id"]]
    assert got[0]["at"] >= sent[0]["at"] + 2.4  # the delivery time is a lower bound, not a speed


def test_unacked_message_comes_back_after_its_invisible_duration(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TInv"), _name("GInv")
    sent = produce(grpc_cluster, topic, 1)
    first = receive(grpc_cluster, topic, group, "--expect", "1", "--no-ack", "--invisible", "2", "--seconds", "10")
    assert [(e["id"], e["attempt"]) for e in first] == [(sent[0]["id"], 1)]
    again = receive(grpc_cluster, topic, group, "--expect", "1", "--seconds", "15")
    assert [(e["id"], e["attempt"]) for e in again] == [(sent[0]["id"], 2)]
    assert again[0]["at"] >= first[0]["at"] + 1.9


def test_push_consumer_failures_are_retried_then_dead_lettered(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TPush"), _name("GPush")
    create_group(grpc_cluster, group, retry_max_times=2)
    sent = produce(grpc_cluster, topic, 1)
    consumed = push(grpc_cluster, topic, group, "--fail", "--seconds", "40", "--stop-after", "3")
    assert [(e["id"], e["attempt"], e["topic"]) for e in consumed] == [(sent[0]["id"], n, topic) for n in (1, 2, 3)]

    rows = dead_letters(grpc_cluster, group)
    assert [(r["originTopic"], r["reconsumeTimes"]) for r in rows] == [(topic, 3)], rows


def test_push_consumer_success(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TPushOk"), _name("GPushOk")
    sent = produce(grpc_cluster, topic, 5)
    consumed = push(grpc_cluster, topic, group, "--seconds", "30", "--stop-after", "5")
    assert sorted(e["id"] for e in consumed) == sorted(e["id"] for e in sent)
    assert receive(grpc_cluster, topic, group, "--seconds", "3") == []


def test_sent_through_4x_received_through_grpc(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TInterop4"), _name("GInterop4")
    with Producer(_name("P4"), grpc_cluster.namesrv_addr) as producer:
        ids = [producer.send(Message(topic, f"from-4x-{i}".encode(), tags="t4", keys=f"k{i}")).msg_id for i in range(4)]
    got = receive(grpc_cluster, topic, group, "--expect", "4", "--seconds", "20")
    assert sorted(e["id"] for e in got) == sorted(ids)
    assert sorted(e["body"] for e in got) == [f"from-4x-{i}" for i in range(4)]
    assert {e["tag"] for e in got} == {"t4"}


def test_sent_through_grpc_received_through_4x(grpc_cluster: DevCluster) -> None:
    topic = _name("TInterop5")
    sent = produce(grpc_cluster, topic, 4, "--tag", "t5")

    messages = pull_everything(grpc_cluster, topic)
    assert sorted(m.msg_id for m in messages) == sorted(e["id"] for e in sent)
    assert sorted(m.body for m in messages) == sorted(e["body"].encode() for e in sent)
    assert {m.tags for m in messages} == {"t5"}


def test_one_topic_two_doors_two_groups_each_see_every_message(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TBoth"), _name("GBoth")
    sent = produce(grpc_cluster, topic, 3)
    got = receive(grpc_cluster, topic, group, "--expect", "3", "--seconds", "20")
    assert sorted(e["id"] for e in got) == sorted(e["id"] for e in sent)

    assert sorted(m.msg_id for m in pull_everything(grpc_cluster, topic)) == sorted(e["id"] for e in sent)


def test_acked_messages_stay_acked_across_kill_9_and_unacked_ones_come_back(make_cluster: Any) -> None:
    cluster = make_cluster(dict(GRPC_CONF), name="grpc-crash")
    topic, group = _name("TCrash"), _name("GCrash")
    sent = produce(cluster, topic, 10)
    acked = receive(cluster, topic, group, "--expect", "4", "--batch", "1", "--seconds", "20")
    held = receive(cluster, topic, group, "--expect", "2", "--batch", "1", "--no-ack", "--invisible", "3")
    assert len(acked) == 4 and len(held) == 2
    cluster.kill()
    cluster.start()
    rest = receive(cluster, topic, group, "--expect", "6", "--seconds", "30", timeout=60)
    rest_ids = [e["id"] for e in rest]
    assert sorted(rest_ids) == sorted({e["id"] for e in sent} - {e["id"] for e in acked})
    assert len(rest_ids) == len(set(rest_ids))
    held_ids = {e["id"] for e in held}
    assert {e["attempt"] for e in rest if e["id"] in held_ids} == {2}


def test_acl_right_and_wrong_secret(make_cluster: Any, tmp_path: Path) -> None:
    cluster = start_acl_cluster(make_cluster, tmp_path, BASE_ACL, conf=dict(GRPC_CONF), name="grpc-acl")
    endpoint = cluster.grpc_endpoint
    ok = run_py5(["produce", "--endpoints", endpoint, "--topic", TOPIC, "--ak", PUB_KEY, "--sk", PUB_SECRET])
    assert of(ok, "summary")[0]["sent"] == 1, ok
    wrong = run_py5(["produce", "--endpoints", endpoint, "--topic", TOPIC, "--ak", PUB_KEY, "--sk", "not-it"])
    assert of(wrong, "summary")[0]["sent"] == 0
    # The route query is refused first (the client says "failed to fetch topic route" and logs why).
    assert "40100, [TXMQ ACL] Check signature failed" in of(wrong, "send_failed")[0]["log"], wrong
    # A subscriber may not publish: a known caller without the permission is Forbidden.
    forbidden = run_py5(["produce", "--endpoints", endpoint, "--topic", TOPIC, "--ak", SUB_KEY, "--sk", SUB_SECRET])
    assert "ForbiddenException" in of(forbidden, "send_failed")[0]["error"], forbidden
    got = run_py5(
        [
            "receive",
            "--endpoints",
            endpoint,
            "--topic",
            TOPIC,
            "--group",
            _name("GAcl"),
            "--expect",
            "1",
            "--seconds",
            "15",
            "--ak",
            SUB_KEY,
            "--sk",
            SUB_SECRET,
        ]
    )
    assert [e["id"] for e in of(got, "received")] == [of(ok, "sent")[0]["id"]]


def test_two_brokers_each_serve_their_queues_and_routes_list_both(make_cluster: Any, add_broker: Any) -> None:
    cluster = make_cluster(dict(GRPC_CONF), name="grpc-two")
    second = add_broker(cluster, "broker-b", dict(GRPC_CONF))
    topic, group = _name("TTwo"), _name("GTwo")
    with Admin(cluster.namesrv_addr) as admin:
        for addr in (cluster.broker_addr, second.broker_addr):
            admin.create_topic(topic, broker_addr=addr, read_queue_nums=2, write_queue_nums=2)
    sent = produce(cluster, topic, 12)  # the client knows only the first broker's endpoint
    with Admin(cluster.namesrv_addr) as admin:
        per_broker = {mq.broker_name: o.max_offset for mq, o in admin.topic_stats(topic).items() if o.max_offset}
    assert set(per_broker) == {"broker-a", "broker-b"}, per_broker  # the route led the producer to both
    got = receive(cluster, topic, group, "--expect", "12", "--seconds", "30")
    assert sorted(e["id"] for e in got) == sorted(e["id"] for e in sent)


def transact(cluster: DevCluster, topic: str, *extra: str, returncode: int = 0) -> list[dict[str, Any]]:
    return run_py5(
        ["transaction", "--endpoints", cluster.grpc_endpoint, "--topic", topic, *extra], 60, returncode=returncode
    )


def test_transactions_commit_and_rollback(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TTx"), _name("GTx")
    committed = transact(grpc_cluster, topic, "--count", "2", "--resolution", "commit", "--body-prefix", "yes-")
    rolled_back = transact(grpc_cluster, topic, "--count", "2", "--resolution", "rollback", "--body-prefix", "no-")
    assert len(of(committed, "ended")) == 2 and len(of(rolled_back, "ended")) == 2, (committed, rolled_back)
    got = receive(grpc_cluster, topic, group, "--expect", "3", "--seconds", "6")
    assert sorted(e["body"] for e in got) == ["yes-0", "yes-1"]
    assert sorted(e["id"] for e in got) == sorted(e["id"] for e in of(committed, "half"))


def test_orphaned_transaction_is_committed_by_another_producer_and_delivered_once(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TOrphan"), _name("GOrphan")
    first = transact(
        grpc_cluster, topic, "--resolution", "none", "--die-after-half", "--body-prefix", "orphan-", returncode=-9
    )
    [half] = of(first, "half")
    second = transact(
        grpc_cluster, topic, "--count", "0", "--checker", "commit", "--hold", "30", "--stop-after-checks", "1"
    )
    checked = of(second, "checked")
    assert checked and {c["id"] for c in checked} == {half["id"]}, second
    got = receive(grpc_cluster, topic, group, "--expect", "2", "--seconds", "6")
    assert [(e["id"], e["body"]) for e in got] == [(half["id"], "orphan-0")]


def test_fifo_push_consumer_keeps_a_groups_order_through_a_failing_message(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TFifoPush"), _name("GFifoPush")
    create_group(grpc_cluster, group, retry_max_times=2, orderly=True)
    produce(grpc_cluster, topic, 4, "--message-group", "one-order")
    consumed = push(grpc_cluster, topic, group, "--fail-body", "m-1", "--seconds", "40", "--stop-after", "6")
    bodies = [e["body"] for e in consumed]
    # m-1 fails every attempt (three: retryMaxTimes 2 + 1) and goes to the DLQ; nothing overtakes it.
    assert bodies == ["m-0", "m-1", "m-1", "m-1", "m-2", "m-3"], consumed
    rows = dead_letters(grpc_cluster, group)
    assert [r["originTopic"] for r in rows] == [topic]
