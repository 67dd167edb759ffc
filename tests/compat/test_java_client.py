"""The official Java client (org.apache.rocketmq:rocketmq-client) against real `txmq dev` processes.

Two lines of the same remoting client: "v4" is 4.9.8, the last 4.x, and "v5" is 5.5.0. The scenarios are the Java
programs in tests/compat/java; they print what they saw, and these tests decide.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from txmq.client.sync import Admin

from .java_client import LINES, JavaProcess, named, run_java

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def consume(line: str, ns: str, topic: str, expect: int, *extra: str, group: str | None = None) -> list[dict]:
    """A DefaultMQPushConsumer that reads ``topic`` until ``expect`` deliveries and a quiet second.

    The scenario waits 75 s at most: when the client's rebalance heartbeat loses its heartbeat lock to the periodic
    one (a race in the client), its pulls carry a subscription version the broker has not seen yet and are answered
    SUBSCRIPTION_NOT_LATEST until the next heartbeat, 30 s later, as they would be by Apache RocketMQ."""
    args = ["--namesrv", ns, "--topic", topic, "--group", group or _name("JCG"), "--expect", str(expect)]
    events = JavaProcess(line, "consume", [*args, *extra]).finish(150)
    return named(events, "received")


def bodies(events: list[dict]) -> collections.Counter[str]:
    return collections.Counter(e["body"] for e in events)


def txmq_admin(ns: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "admin", "-n", ns, *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# -- transactions --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", LINES)
def test_commit_rollback_and_check_backs(txmq_cluster: Any, line: str) -> None:
    """COMMIT, ROLLBACK, UNKNOWN then a check answered COMMIT, and one answered ROLLBACK: a push consumer gets every
    committed body exactly once and never a rolled-back one; each check carries the transaction id and the keys."""
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("JTx"), _name("JTxPG")
    events = run_java(
        line, "tx-produce", "--namesrv", ns, "--topic", topic, "--group", group,
        "--plan", "COMMIT,ROLLBACK,UNKNOWN>COMMIT,UNKNOWN>ROLLBACK", "--count", "8",
        "--keys", "order-{i}", "--prop", "orderId={i}", "--linger", "60",
    )  # fmt: skip
    sent = named(events, "sent")
    assert [e["status"] for e in sent] == ["SEND_OK"] * 8, events
    assert named(events, "summary")[0]["finalChecks"] == 4
    executed = {e["body"]: e["transactionId"] for e in named(events, "executed")}
    checks = named(events, "checked")
    final_checks = [c for c in checks if c["answer"] != "UNKNOWN"]
    assert sorted(c["body"] for c in final_checks) == ["m-2", "m-3", "m-6", "m-7"]
    for c in checks:
        i = c["body"].split("-")[1]
        assert c["transactionId"] == executed[c["body"]] == c["uniqKey"]
        assert c["keys"] == f"order-{i}" and c["properties"]["orderId"] == i
        assert c["topic"] == topic and c["properties"]["PGROUP"] == group
        assert int(c["properties"]["TRANSACTION_CHECK_TIMES"]) >= 1
    received = consume(line, ns, topic, 4)
    assert bodies(received) == {"m-0": 1, "m-2": 1, "m-4": 1, "m-6": 1}
    for e in received:
        i = e["body"].split("-")[1]
        assert e["keys"] == f"order-{i}" and e["properties"]["orderId"] == i
        assert "TRAN_MSG" not in e["properties"]
    # An operator sees each of them, and who ended it.
    shown = txmq_admin(ns, "tx", "show", executed["m-6"])
    assert "COMMITTED" in shown and "check" in shown, shown
    shown = txmq_admin(ns, "tx", "show", executed["m-3"])
    assert "ROLLED_BACK" in shown, shown
    shown = txmq_admin(ns, "tx", "show", executed["m-0"])
    assert "COMMITTED" in shown and "producer" in shown, shown


@pytest.mark.parametrize("line", LINES)
def test_a_killed_producer_is_answered_for_by_a_second_jvm(txmq_cluster: Any, line: str) -> None:
    """The producer JVM dies (SIGKILL) right after its half message; a second JVM of the group answers the check."""
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("JTxKill"), _name("JTxKillPG")
    first = JavaProcess(
        line, "tx-produce",
        ["--namesrv", ns, "--topic", topic, "--group", group, "--plan", "COMMIT", "--keys", "pay-9527",
         "--body-prefix", "payment-", "--hang-after-half"],
    )  # fmt: skip
    executed = first.wait_event("executed", 60)
    first.kill()
    # While nobody answers, an operator sees it in doubt.
    listed = txmq_admin(ns, "tx", "list", "--group", group)
    assert executed["transactionId"] in listed or "payment-0" in listed or topic in listed, listed
    checker = JavaProcess(
        line, "tx-check", ["--namesrv", ns, "--group", group, "--topic", topic, "--answer", "COMMIT", "--linger", "60"]
    )
    events = checker.finish(120)
    [check] = named(events, "checked")
    assert check["transactionId"] == executed["transactionId"]
    assert check["keys"] == "pay-9527" and check["body"] == "payment-0"
    received = consume(line, ns, topic, 1)
    assert bodies(received) == {"payment-0": 1}
    assert "COMMITTED" in txmq_admin(ns, "tx", "show", executed["transactionId"])


@pytest.mark.parametrize("line", LINES)
def test_check_immunity_and_check_times_properties(make_cluster: Any, line: str) -> None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS postpones the first check; a TRANSACTION_CHECK_TIMES the application set counts
    toward transactionCheckMax (here 3), so the message is checked once more and then discarded."""
    cluster = make_cluster({"transactionCheckMax": "3"}, name="checkmax")
    ns = cluster.namesrv_addr
    topic, group = _name("JTxImm"), _name("JTxImmPG")
    started = time.time()
    events = run_java(
        line, "tx-produce", "--namesrv", ns, "--topic", topic, "--group", group, "--plan", "UNKNOWN>COMMIT",
        "--prop", "CHECK_IMMUNITY_TIME_IN_SECONDS=4", "--linger", "60",
    )  # fmt: skip
    [check] = named(events, "checked")
    assert check["storeTimestamp"] / 1000 + 4 <= time.time()
    assert time.time() - started >= 4
    assert bodies(consume(line, ns, topic, 1)) == {"m-0": 1}

    topic = _name("JTxMax")
    events = run_java(
        line, "tx-produce", "--namesrv", ns, "--topic", topic, "--group", group, "--plan", "UNKNOWN",
        "--prop", "TRANSACTION_CHECK_TIMES=2", "--linger", "6",
    )  # fmt: skip
    checks = named(events, "checked")
    assert [c["properties"]["TRANSACTION_CHECK_TIMES"] for c in checks] == ["3"], events
    sent = named(events, "sent")[0]
    shown = txmq_admin(ns, "tx", "show", sent["msgId"])
    assert "DISCARDED" in shown, shown


def test_seed_004_order_9527_with_the_legacy_api(txmq_cluster: Any) -> None:
    """The seed's producer: TransactionCheckListener + LocalTransactionExecuter (4.x only), body 9527, shut down
    right after the send. Its COMMIT reaches the consumer once; a second run whose local transaction is unknown is
    committed by its check listener."""
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("TopicTest"), _name("please_rename_unique_group_name")
    events = run_java("v4", "seed004", "--namesrv", ns, "--topic", topic, "--group", group)
    assert named(events, "sent")[0]["status"] == "SEND_OK" and named(events, "executed")[0]["body"] == "9527"
    events = run_java(
        "v4", "seed004", "--namesrv", ns, "--topic", topic, "--group", group, "--body", "9528",
        "--local", "UNKNOWN", "--check", "COMMIT", "--linger", "8",
    )  # fmt: skip
    assert [c["body"] for c in named(events, "checked")][:1] == ["9528"], events
    assert bodies(consume("v4", ns, topic, 2)) == {"9527": 1, "9528": 1}


@pytest.mark.parametrize("line", LINES)
def test_seed_transaction_listener_producer(txmq_cluster: Any, line: str) -> None:
    """The seeds' TransactionListener sample: its own check thread pool, five tags, every local transaction unknown
    and settled by checks (i % 3: 1 commit, 2 rollback, 0 stays unknown)."""
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("TransactionTopicTest"), _name("TransactionProducerGroup")
    events = run_java("v4" if line == "v4" else "v5", "seed-listener", "--namesrv", ns, "--topic", topic,
                      "--group", group, "--count", "10", "--linger", "60")  # fmt: skip
    assert named(events, "summary")[0]["finalChecks"] == 6, events
    committed = {f"Hello RocketMQ {i}" for i in range(10) if i % 3 == 1}
    received = consume(line, ns, topic, len(committed))
    assert bodies(received) == dict.fromkeys(committed, 1)
    assert {e["tags"] for e in received} <= {"TagA", "TagB", "TagC", "TagD", "TagE"}


@pytest.mark.parametrize("line", LINES)
def test_transactions_across_two_brokers(make_cluster: Any, add_broker: Any, line: str) -> None:
    """A topic on two brokers: half messages land on both, each END_TRANSACTION and each check-back is between the
    producer and the broker holding that half, and the consumer reads the committed ones from both."""
    cluster = make_cluster(name="two")
    add_broker(cluster, "broker-b")
    ns = cluster.namesrv_addr
    topic, group = _name("JTx2"), _name("JTx2PG")
    with Admin(ns) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")
        assert {q.broker_name for q in admin.topic_route(topic).queue_datas} == {"broker-a", "broker-b"}
    events = run_java(
        line, "tx-produce", "--namesrv", ns, "--topic", topic, "--group", group,
        "--plan", "COMMIT,ROLLBACK,UNKNOWN>COMMIT,UNKNOWN>ROLLBACK", "--count", "16", "--linger", "60",
    )  # fmt: skip
    sent = named(events, "sent")
    assert {e["broker"] for e in sent} == {"broker-a", "broker-b"}, sent
    assert named(events, "summary")[0]["finalChecks"] == 8, events
    committed = {f"m-{i}" for i in range(16) if i % 4 in (0, 2)}
    assert bodies(consume(line, ns, topic, len(committed))) == dict.fromkeys(committed, 1)
    on_b = next(e for e in sent if e["broker"] == "broker-b" and e["i"] % 4 == 2)
    shown = txmq_admin(ns, "tx", "show", on_b["msgId"])
    assert "broker-b" in shown and "COMMITTED" in shown, shown
