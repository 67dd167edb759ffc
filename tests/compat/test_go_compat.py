"""The official Go client (github.com/apache/rocketmq-client-go/v2, pinned in tests/compat/go/go.mod) against
`txmq dev`: sync sends, a clustering push consumer, and a transaction producer whose local transactions commit,
roll back, or stay UNKNOWN until a check-back answers.

The Go program (tests/compat/go/cmd/txmqgo) only prints what it saw; every verdict is here.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from txmq.client.sync import Admin
from txmq.errors import NoRouteError
from txmq.testing import eventually

from .go_client import Event, ensure_binary, go_processes, run_go

pytestmark = pytest.mark.slow

SEND_OK = 0  # primitive.SendOK


@pytest.fixture(scope="session")
def txmqgo() -> Path:
    return ensure_binary()


@pytest.fixture
def go(txmqgo):
    """Starts txmqgo in the background: ``go(args, more_args, ...)``; all are killed when the test ends."""
    with go_processes() as start:
        yield lambda *parts: start([str(a) for part in parts for a in part])


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


def _has_route(admin: Admin, topic: str) -> bool:
    try:
        return bool(admin.topic_route(topic).queue_datas)
    except NoRouteError:  # until the broker has registered the topic with the name server
        return False


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
    # Every UNKNOWN one is checked. A decided one is normally not (its END_TRANSACTION came first); should a stalled
    # machine let a check overtake it, the admin view below still says the producer decided it.
    assert unknown <= set(checked), f"checked {dict(checked)}, expected every UNKNOWN one {sorted(unknown)}"
    for check in checks:
        body = check["body"]
        assert check["transaction_id"] == sent[body]["msg_id"], check
        assert check["keys"] == sent[body]["keys"], check
        assert check["topic"] == topic and check["tags"] == "TxTag", check
        assert check["producer_group"] == pgroup, check
        assert check["answer"] == item[body].split("-")[-1].upper(), check

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
            decision = item[body].split("-")[-1].upper()
            assert set(answers) <= {decision, None} and (body not in unknown or decision in answers), tx
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


def test_every_go_send_mode_and_compressed_bodies_are_consumed_once(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoModes"), _name("GoModesCG")
    count = 10
    expected: set[str] = set()
    for mode in ("sync", "async", "oneway", "batch"):
        run = run_go(
            ["send", "--namesrv", ns, "--topic", topic, "--count", count, "--mode", mode, "--body-prefix", f"{mode}-"],
            timeout=60,
        )
        assert run.returncode == 0, run.describe()
        if mode in ("sync", "async"):
            assert sorted(e["body"] for e in run.of("sent")) == sorted(f"{mode}-{i}" for i in range(count))
            assert all(e["status"] == SEND_OK for e in run.of("sent"))
        elif mode == "batch":
            # One SEND_BATCH_MESSAGE: the broker answers with every stored message's offset msgId, comma-separated.
            (result,) = run.of("sent")
            assert result["status"] == SEND_OK and len(set(result["offset_msg_id"].split(","))) == count, result
        expected |= {f"{mode}-{i}" for i in range(count)}
    # Bodies over 4 KiB are zlib-compressed by the Go producer (sysFlag bit 0); the consumer must get them back whole.
    size = 10_000
    big = run_go(
        ["send", "--namesrv", ns, "--topic", topic, "--count", 3, "--body-prefix", "big-", "--body-size", size],
        timeout=60,
    )
    assert big.returncode == 0, big.describe()
    consumer = _consume(go, ns, topic, group, len(expected) + 3)
    assert consumer.wait(90) == 0, consumer.describe()
    received = consumer.of("received")
    large = [e for e in received if e["body"].startswith("big-")]
    assert sorted(e["body"][:5] for e in large) == ["big-0", "big-1", "big-2"]
    assert all(len(e["body"]) == size and e["body"].endswith(".") for e in large)
    _assert_exactly_once([e for e in received if not e["body"].startswith("big-")], expected)


def test_go_consumer_gets_a_message_again_after_reconsume_later(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoRetry"), _name("GoRetryCG")
    sender = run_go(["send", "--namesrv", ns, "--topic", topic, "--count", 4, "--body-prefix", "r-"], timeout=60)
    assert sender.returncode == 0, sender.describe()
    ids = {e["body"]: e["msg_id"] for e in sender.of("sent")}
    # The first heartbeat makes %RETRY%group (here as on a Java broker), but the Go client rebalances on the
    # broker's notification before its route refresh (10 ms after start, then every 30 s) has seen that topic, so
    # a new group's retries often wait for the next rebalance, 20 s later. Making the retry topic first, as an
    # operator would, keeps this test short; the send-back path is the same.
    with Admin(ns) as admin:
        admin.create_topic(
            f"%RETRY%{group}", broker_addr=txmq_cluster.broker_addr, read_queue_nums=1, write_queue_nums=1
        )
        eventually(lambda: _has_route(admin, f"%RETRY%{group}"), "a route for the retry topic")
    consumer = go(
        ["consume", "--namesrv", ns, "--topic", topic, "--group", group],
        ["--expect", "4", "--timeout", "90", "--linger", "3", "--fail-first"],
    )
    assert consumer.wait(120) == 0, consumer.describe()
    # The first delivery of each body is refused (CONSUMER_SEND_MSG_BACK to %RETRY%group); it comes back once.
    assert sorted(e["body"] for e in consumer.of("failed_once")) == sorted(ids)
    received = consumer.of("received")
    _assert_exactly_once(received, set(ids))
    for event in received:
        assert event["reconsume_times"] == 1, event
        assert event["topic"] == topic and event["msg_id"] == ids[event["body"]], event


def test_go_orderly_consumer_keeps_queue_order_through_a_suspend(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoOrderly"), _name("GoOrderlyCG")
    count = 16
    sender = run_go(["send", "--namesrv", ns, "--topic", topic, "--count", count, "--body-prefix", "o-"], timeout=60)
    assert sender.returncode == 0, sender.describe()
    consumer = go(
        ["consume", "--namesrv", ns, "--topic", topic, "--group", group],
        ["--expect", str(count), "--timeout", "60", "--linger", "3", "--orderly", "--fail-first"],
    )
    assert consumer.wait(90) == 0, consumer.describe()
    received = consumer.of("received")
    _assert_exactly_once(received, {f"o-{i}" for i in range(count)})
    by_queue: dict[int, list[int]] = collections.defaultdict(list)
    for event in received:  # in the order the consumer printed them
        by_queue[event["queue_id"]].append(event["queue_offset"])
    for queue_id, offsets in by_queue.items():
        assert offsets == sorted(offsets), f"queue {queue_id} consumed out of order: {offsets}"


def test_go_consumer_group_resumes_from_its_committed_offsets(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoOffsets"), _name("GoOffsetsCG")
    assert run_go(["send", "--namesrv", ns, "--topic", topic, "--count", 8, "--body-prefix", "a-"], 60).returncode == 0
    first = _consume(go, ns, topic, group, 8, linger=1)
    assert first.wait(90) == 0, first.describe()
    _assert_exactly_once(first.of("received"), {f"a-{i}" for i in range(8)})
    # Shutdown persisted the offsets (UPDATE_CONSUMER_OFFSET); the next member of the group starts after them.
    assert run_go(["send", "--namesrv", ns, "--topic", topic, "--count", 5, "--body-prefix", "b-"], 60).returncode == 0
    second = _consume(go, ns, topic, group, 5, linger=3)
    assert second.wait(90) == 0, second.describe()
    _assert_exactly_once(second.of("received"), {f"b-{i}" for i in range(5)})


def test_go_tag_subscription_gets_only_its_tags(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoTags"), _name("GoTagsCG")
    for tag in ("TagA", "TagB", "TagC"):
        run = run_go(
            ["send", "--namesrv", ns, "--topic", topic, "--count", 3, "--tag", tag, "--body-prefix", f"{tag}-"], 60
        )
        assert run.returncode == 0, run.describe()
    consumer = go(
        ["consume", "--namesrv", ns, "--topic", topic, "--group", group, "--tag", "TagA || TagC"],
        ["--expect", "6", "--timeout", "60", "--linger", "3"],
    )
    assert consumer.wait(90) == 0, consumer.describe()
    received = consumer.of("received")
    _assert_exactly_once(received, {f"{t}-{i}" for t in ("TagA", "TagC") for i in range(3)})
    assert all(e["tags"] == e["body"].split("-")[0] for e in received)


def test_unknown_go_transaction_survives_a_broker_crash_and_another_instance_commits_it(make_cluster, go) -> None:
    cluster = make_cluster()
    ns = cluster.namesrv_addr
    topic, pgroup, cgroup = _name("GoTxCrash"), _name("GoTxCrashPG"), _name("GoTxCrashCG")
    first = go(
        ["tx", "--namesrv", ns, "--topic", topic, "--group", pgroup, "--plan", "unknown", "--keys", "crash-{i}"],
        ["--wait-checks", "1", "--timeout", "60", "--linger", "120"],
    )
    (check,) = first.wait_for(lambda e: e.get("event") == "check", 60)
    (sent,) = first.of("tx_sent")
    assert check["answer"] == "UNKNOWN" and check["transaction_id"] == sent["msg_id"]
    with Admin(ns) as admin:
        eventually(
            lambda: [c["answer"] for c in admin.transaction(sent["msg_id"])["checkLog"]][:1] == ["UNKNOWN"],
            "the UNKNOWN answer in the transaction's check history",
        )
    first.kill()
    # The check history reaches its journal after each check round (about a second); give it two, then crash.
    time.sleep(2.5)
    cluster.kill()
    cluster.start()

    # A new instance of the group, unaware of the transaction, learns of it from the broker's check and commits it.
    second = go(
        ["tx", "--namesrv", ns, "--topic", topic, "--group", pgroup, "--plan", "commit", "--body-prefix", "second-"],
        ["--check-unplanned", "commit", "--wait-unplanned", "1", "--timeout", "60", "--linger", "2"],
    )
    assert second.wait(90) == 0, second.describe()
    foreign = [c for c in second.of("check") if not c["planned"]]
    assert {c["transaction_id"] for c in foreign} == {sent["msg_id"]}, foreign
    assert {c["keys"] for c in foreign} == {"crash-0"} and {c["body"] for c in foreign} == {sent["body"]}
    assert {c["answer"] for c in foreign} == {"COMMIT"}

    consumer = _consume(go, ns, topic, cgroup, 2)
    assert consumer.wait(90) == 0, consumer.describe()
    (second_sent,) = second.of("tx_sent")
    _assert_exactly_once(consumer.of("received"), {sent["body"], second_sent["body"]})
    with Admin(ns) as admin:
        tx = admin.transaction(sent["msg_id"])
    assert tx["state"] == "COMMITTED" and tx["resolvedBy"] == "check", tx
    answers = [c["answer"] for c in tx["checkLog"]]
    assert answers[0] == "UNKNOWN" and answers[-1] == "COMMIT", answers
    assert set(answers[1:-1]) <= {"UNKNOWN", None}, answers  # None: a check the killed producer never answered


def test_go_admin_creates_a_topic_and_a_push_consumer_starts_on_it_at_once(txmq_cluster, go) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("GoCreated"), _name("GoCreatedCG")
    # UPDATE_AND_CREATE_TOPIC from the Go admin client, then at once a push consumer, which refuses to start on a
    # topic the name server cannot route.
    consumer = go(
        ["consume", "--namesrv", ns, "--topic", topic, "--group", group, "--create-topic", txmq_cluster.broker_addr],
        ["--expect", "5", "--timeout", "60", "--linger", "2"],
    )
    consumer.wait_for(lambda e: e.get("event") == "started", 30)
    (created,) = consumer.of("topic_created")
    assert created["topic"] == topic
    with Admin(ns) as admin:
        route = admin.topic_route(topic)
    assert [(q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [(4, 4)]
    sender = run_go(["send", "--namesrv", ns, "--topic", topic, "--count", 5, "--body-prefix", "c-"], timeout=60)
    assert sender.returncode == 0, sender.describe()
    assert consumer.wait(90) == 0, consumer.describe()
    _assert_exactly_once(consumer.of("received"), {f"c-{i}" for i in range(5)})


def test_go_request_gets_a_reply_from_a_txmq_consumer(txmq_cluster, txmqgo) -> None:
    """Request-reply: the Go client's Producer.Request, answered by txmq's own push consumer with create_reply.

    rocketmq-client-go v2.1.2's Request sends asynchronously with a fixed 3 s deadline, and its callback dereferences
    the missing response when that deadline passes (a panic in ProcessSendResponse): on a machine so loaded that a
    send takes 3 s, this test fails in the client (docs/wire-notes.md)."""
    import asyncio
    import threading

    from txmq.client import ConsumeStatus, MessageExt, Producer, PushConsumer
    from txmq.client.request_reply import create_reply

    ns = txmq_cluster.namesrv_addr
    topic = _name("GoReq")
    with Admin(ns) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")
    ready, stop = threading.Event(), threading.Event()
    answered: list[bytes] = []

    async def serve() -> None:
        async with Producer(_name("GoRepPG"), ns) as replier:

            async def answer(msgs: list[MessageExt]) -> ConsumeStatus:
                for m in msgs:
                    await replier.send(create_reply(m, b"re:" + m.body))
                    answered.append(m.body)
                return ConsumeStatus.CONSUME_SUCCESS

            consumer = PushConsumer(_name("GoRepG"), ns)
            consumer.subscribe(topic)
            consumer.register_listener(answer)
            async with consumer:
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)

    server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    server.start()
    try:
        assert ready.wait(30)
        args = ["request", "--namesrv", ns, "--topic", topic, "--count", "3", "--reply-timeout", "20s"]
        run = run_go(args, 120)
        if run.returncode != 0 and "ProcessSendResponse" in run.stderr:
            # The client's nil-response panic (docstring). Seen once in CI 50 ms after the requests started, not
            # after 3 s: the broker's log shows the client's connection reset right after two replies reached it.
            # The cause in the client is not known. Once more; a second failure fails the test.
            run = run_go(args, 120)
    finally:
        stop.set()
        server.join(30)
    assert run.returncode == 0, run.describe()
    assert [(e["i"], e["body"]) for e in run.of("reply")] == [(i, f"re:go-ask-{i}") for i in range(3)], run.describe()
    assert {e["topic"] for e in run.of("reply")} == {"DefaultCluster_REPLY_TOPIC"}
