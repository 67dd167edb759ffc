"""The official Go client (github.com/apache/rocketmq-client-go/v2, pinned in tests/compat/go/go.mod) against
`txmq dev`: sync sends, a clustering push consumer, and a transaction producer whose local transactions commit,
roll back, or stay UNKNOWN until a check-back answers.

The Go program (tests/compat/go/cmd/txmqgo) only prints what it saw; every verdict is here.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from txmq.client.sync import Admin

from .go_client import Event, ensure_binary, go_processes, run_go

pytestmark = pytest.mark.slow

SEND_OK = 0  # primitive.SendOK


@pytest.fixture(scope="session")
def txmqgo() -> Path:
    return ensure_binary()


@pytest.fixture
def go(txmqgo):
    with go_processes() as start:
        yield start


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _bodies(events: list[Event]) -> collections.Counter[str]:
    return collections.Counter(e["body"] for e in events)


def _assert_exactly_once(received: list[Event], expected: set[str]) -> None:
    counts = _bodies(received)
    duplicates = {b: n for b, n in counts.items() if n > 1}
    assert not duplicates, f"delivered more than once: {duplicates}"
    assert set(counts) == expected, (
        f"missing {sorted(expected - set(counts))}, unexpected {sorted(set(counts) - expected)}"
    )


def _consume(go, ns: str, topic: str, group: str, expect: int, linger: float = 3.0):
    return go(
        [
            "consume",
            "--namesrv",
            ns,
            "--topic",
            topic,
            "--group",
            group,
            "--expect",
            str(expect),
            "--timeout",
            "60",
            "--linger",
            str(linger),
        ]
    )


def _admin_cli(ns: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "admin", "--namesrv", ns, "tx", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_sync_sends_are_consumed_once_by_a_go_push_consumer(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoSync"), _name("GoSyncCG")
    count = 20
    sender = run_go(
        ["send", "--namesrv", ns, "--topic", topic, "--count", count, "--tag", "TagA", "--keys", "sync-key-{i}"],
        timeout=60,
    )
    assert sender.returncode == 0, sender.describe()
    sent = sender.of("sent")
    assert len(sent) == count and all(e["status"] == SEND_OK for e in sent), sender.describe()
    assert len({e["msg_id"] for e in sent}) == count
    assert len({e["offset_msg_id"] for e in sent}) == count

    consumer = _consume(go, ns, topic, group, count)
    assert consumer.wait(90) == 0, consumer.describe()
    received = consumer.of("received")
    _assert_exactly_once(received, {f"go-{i}" for i in range(count)})
    by_body = {e["body"]: e for e in sent}
    for event in received:
        i = event["body"].removeprefix("go-")
        assert event["topic"] == topic and event["tags"] == "TagA" and event["keys"] == f"sync-key-{i}"
        # The msgId a Go consumer sees is the UNIQ_KEY the producer was given; the offset msgId is the stored one.
        assert event["msg_id"] == by_body[event["body"]]["msg_id"]
        assert event["offset_msg_id"] == by_body[event["body"]]["offset_msg_id"]
        assert event["queue_offset"] == by_body[event["body"]]["queue_offset"]


PLAN = ["commit", "rollback", "unknown:commit", "unknown:rollback"]


def test_go_transactions_commit_rollback_and_answered_check_backs(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, pgroup, cgroup = _name("GoTx"), _name("GoTxPG"), _name("GoTxCG")
    plan = PLAN * 2
    producer = run_go(
        [
            "tx",
            "--namesrv",
            ns,
            "--topic",
            topic,
            "--group",
            pgroup,
            "--plan",
            ",".join(plan),
            "--keys",
            "order-{i},shard-{i}",
            "--tag",
            "TxTag",
            "--timeout",
            "60",
            "--linger",
            "2",
        ],
        timeout=90,
    )
    assert producer.returncode == 0, producer.describe()
    sent = {e["body"]: e for e in producer.of("tx_sent")}
    assert len(sent) == len(plan) and all(e["status"] == SEND_OK for e in sent.values()), producer.describe()
    item = {e["body"]: e["body"].split("-", 2)[2] for e in sent.values()}  # "gotx-3-unknown-rollback" -> plan item
    local = {e["body"]: e for e in producer.of("local")}
    for body, event in sent.items():
        # The local transaction sees the transaction id (UNIQ_KEY) and the keys the application set.
        assert local[body]["transaction_id"] == event["msg_id"]
        assert local[body]["keys"] == event["keys"]

    checks = producer.of("check")
    checked = _bodies(checks)
    unknown = {b for b, it in item.items() if it.startswith("unknown")}
    assert set(checked) == unknown, f"checked {dict(checked)}, expected exactly the UNKNOWN ones {sorted(unknown)}"
    for check in checks:
        body = check["body"]
        assert check["transaction_id"] == sent[body]["msg_id"], check
        assert check["keys"] == sent[body]["keys"], check
        assert check["topic"] == topic and check["tags"] == "TxTag", check
        assert check["producer_group"] == pgroup, check
        assert check["answer"] == item[body].split("-")[1].upper(), check

    committed = {b for b, it in item.items() if it in ("commit", "unknown-commit")}
    consumer = _consume(go, ns, topic, cgroup, len(committed))
    assert consumer.wait(90) == 0, consumer.describe()
    received = consumer.of("received")
    _assert_exactly_once(received, committed)
    delivered = {e["body"]: e for e in received}
    for body, event in delivered.items():
        assert event["msg_id"] == sent[body]["msg_id"] and event["keys"] == sent[body]["keys"]
        assert event["tags"] == "TxTag"

    with Admin(ns) as admin:
        for body, event in sent.items():
            tx = admin.transaction(event["msg_id"])
            assert tx["transactionId"] == event["msg_id"] and tx["uniqKey"] == event["msg_id"], tx
            assert tx["producerGroup"] == pgroup and tx["topic"] == topic, tx
            assert tx["halfMsgId"] == event["offset_msg_id"], tx
            assert tx["state"] == ("COMMITTED" if body in committed else "ROLLED_BACK"), tx
            assert tx["resolvedBy"] == ("check" if body in unknown else "producer"), tx
            assert tx["deliveredMsgId"] == (delivered[body]["offset_msg_id"] if body in committed else None), tx
            answers = [c["answer"] for c in tx["checkLog"]]
            assert answers == ([item[body].split("-")[1].upper()] if body in unknown else []), tx
    # The operator's command line shows the same, found by the id the Go client knows.
    for body in (b for b in unknown):
        shown = _admin_cli(ns, "show", sent[body]["msg_id"])
        assert sent[body]["msg_id"] in shown and pgroup in shown
        assert ("COMMITTED" if body in committed else "ROLLED_BACK") in shown


def test_go_check_backs_repeat_while_unknown_and_tx_list_shows_the_transaction(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, pgroup, cgroup = _name("GoTxOpen"), _name("GoTxOpenPG"), _name("GoTxOpenCG")
    producer = go(
        [
            "tx",
            "--namesrv",
            ns,
            "--topic",
            topic,
            "--group",
            pgroup,
            "--plan",
            "unknown,commit",
            "--keys",
            "open-{i}",
            "--wait-checks",
            "2",
            "--timeout",
            "60",
            "--linger",
            "120",
        ]
    )
    sent = producer.wait_for(lambda e: e.get("event") == "tx_sent", 30, count=2)
    open_tx = next(e for e in sent if e["body"].endswith("-unknown"))
    checks = producer.wait_for(lambda e: e.get("event") == "check", 60, count=2)
    # Every check of the same transaction carries the same transaction id and keys, and says how often it was checked.
    assert {c["body"] for c in checks} == {open_tx["body"]}
    assert {c["transaction_id"] for c in checks} == {open_tx["msg_id"]}
    assert {c["keys"] for c in checks} == {"open-0"}
    times = [int(c["properties"]["TRANSACTION_CHECK_TIMES"]) for c in checks]
    assert times == sorted(times) and len(set(times)) == len(times), times

    with Admin(ns) as admin:
        listed = admin.list_transactions(group=pgroup)
        assert [row["transactionId"] for row in listed] == [open_tx["msg_id"]], listed
        assert listed[0]["state"] == "PREPARED" and listed[0]["checks"] >= 2, listed
    text = _admin_cli(ns, "list", "--group", pgroup)
    assert open_tx["msg_id"] in text and topic in text, text

    # The producer goes away; an operator commits by hand, and the Go consumer gets the message once.
    assert producer.terminate() == 0, producer.describe()
    _admin_cli(ns, "resolve", open_tx["msg_id"], "commit")
    consumer = _consume(go, ns, topic, cgroup, 2)
    assert consumer.wait(90) == 0, consumer.describe()
    _assert_exactly_once(consumer.of("received"), {e["body"] for e in sent})
    assert _admin_cli(ns, "list", "--group", pgroup).count(open_tx["msg_id"]) == 0
