"""Differential tests of the 5.x door (issue 24, with issue 14): the official RocketMQ 5.x Java client
(``rocketmq-client-java``, tests/compat/java5) against txmq's gRPC door and against Apache RocketMQ 5.5.0's proxy in
local mode (``ProxyStartup -pm local``), with the same broker settings. Each test prints a side-by-side table (also
appended to bench/out/reference-diff.md) and fails on a difference that docs/compat.md does not explain.

``TXMQ_REFERENCE`` (quick, full, off) and ``TXMQ_REFERENCE_BROKERS`` work as in tests/compat/test_reference.py.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from txmq.protocol.codes import RequestCode

from . import reference as ref
from .py5_client import of
from .test_java5_client import run_java5
from .test_reference import EARLY_CHECKS, SECOND_DECISION, pull_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(ref.MODE == "off", reason="TXMQ_REFERENCE=off"),
]
full_only = pytest.mark.skipif(ref.MODE != "full", reason="TXMQ_REFERENCE=full runs this scenario")

# Both brokers: a received message becomes visible again after 1 s at the least (the client asks 15 s), retries of a
# push consumer back off by the delay levels (1 s each in reference.CONF).
CONF = {"minInvisibleTimeMillsForRecv": "1000"}

UNKNOWN_GROUP = (
    "RocketMQ 5.5.0's proxy refuses a 5.x consumer whose group was never created (its Telemetry stream ends "
    "with INVALID_ARGUMENT, group not found); txmq creates it, as both brokers do for 4.x consumers "
    "(autoCreateSubscriptionGroup)"
)


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


class Endpoint:
    """A started cluster and what a 5.x client is given as its endpoints."""

    def __init__(self, broker: str, cluster: Any) -> None:
        self.broker = broker
        self.cluster = cluster
        if broker == "txmq":
            self.endpoints = cluster.grpc_endpoint
        else:
            self.endpoints = f"127.0.0.1:{cluster.proxy_port + 1}"


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Endpoint]]:
    """txmq with its gRPC door, and RocketMQ's name server with the proxy in local mode (broker and gRPC front in one
    JVM), both with reference.CONF."""
    started: dict[str, Endpoint] = {}
    try:
        for broker in ref.BROKERS:
            data_dir = tmp_path_factory.mktemp(f"ref5-{broker}")
            if broker == "txmq":
                cluster = ref.start("txmq", data_dir, CONF)
            else:
                rocketmq = ref.apache_rocketmq.RocketMQCluster(
                    data_dir, {**ref.CONF, **CONF}, flush="SYNC_FLUSH", proxy=True
                )
                cluster = rocketmq.start()
            started[broker] = Endpoint(broker, cluster)
        yield started
    finally:
        for door in started.values():
            ref.stop(door.cluster)


def compare(
    scenario: str,
    doors: dict[str, Endpoint],
    observe: Any,
    differences: dict[str, str] | None = None,
    report_only: set[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    differences = differences or {}
    seen = {broker: observe(door) for broker, door in doors.items()}
    table = ref.record(f"5.x client: {scenario}", seen, {**differences, **dict.fromkeys(report_only, "(timing)")})
    print(table)
    assert not ref.unexplained(seen, differences, report_only), table
    return seen


def create_topic(door: Endpoint, topic: str, message_type: str) -> None:
    """UPDATE_AND_CREATE_TOPIC on the broker's remoting port (auto-create is off), with RocketMQ 5's
    ``message.type`` attribute, which its proxy checks a send against."""
    ext = {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
        "attributes": f"+message.type={message_type}",
    }  # fmt: skip
    answer = ref.request(door.cluster.broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    assert answer["code"] == 0, answer


def create_group(door: Endpoint, group: str, retry_max_times: int = 16, orderly: bool = False) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on the broker's remoting port, as mqadmin updateSubGroup does."""
    body = orjson.dumps({"groupName": group, "retryMaxTimes": retry_max_times, "consumeMessageOrderly": orderly})
    answer = ref.request(door.cluster.broker_addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
    assert answer["code"] == 0, answer


def bodies(events: list[dict]) -> dict[str, int]:
    return dict(sorted(collections.Counter(e["body"] for e in events).items()))


# -- producers and the SimpleConsumer --------------------------------------------------------------------------------


def test_send_and_receive(doors: dict[str, Endpoint]) -> None:
    """Five messages with a tag, keys and a property, sent and received with a SimpleConsumer that acks: what comes
    back, on which attempt; a second receive of the same group gets nothing more."""

    def observe(door: Endpoint) -> dict[str, Any]:
        topic, group = _name("Ref5"), _name("Ref5G")
        create_topic(door, topic, "NORMAL")
        create_group(door, group)
        sent = run_java5(["produce", door.endpoints, topic, 5])
        got = of(run_java5(["receive", door.endpoints, topic, group, 5, 30]), "received")
        again = of(run_java5(["receive", door.endpoints, topic, group, 1, 4]), "received")
        by_id = {e["id"]: e for e in of(sent, "sent")}
        return {
            "send summary": of(sent, "summary")[0],
            "received bodies": bodies(got),
            "received ids are the sent ids": sorted(e["id"] for e in got) == sorted(by_id),
            "tags, attempts, index property": sorted(
                {(e["tag"], e["attempt"], e["body"][2:] == e["index"]) for e in got}
            ),
            "received again after ack": bodies(again),
            "a consumer of a group never created": starts(door, topic),
        }

    compare("send, receive, ack", doors, observe, {"a consumer of a group never created": UNKNOWN_GROUP})


def starts(door: Endpoint, topic: str) -> str:
    """Whether a SimpleConsumer of a group nobody created starts (the 4.x door auto-creates groups on both)."""
    try:
        run_java5(["receive", door.endpoints, topic, _name("Ref5New"), 1, 3])
    except AssertionError:
        return "refused: the consumer fails to start"
    return "starts"


def test_transactions_commit_rollback_and_an_orphan(doors: dict[str, Endpoint]) -> None:
    """Two committed, one rolled back, and one orphan (its JVM halted after the half message) answered COMMIT by a
    second producer of the topic through the server's check: what is checked and what is delivered."""

    def observe(door: Endpoint) -> dict[str, Any]:
        topic, group = _name("Ref5Tx"), _name("Ref5TxG")
        create_topic(door, topic, "TRANSACTION")
        create_group(door, group)
        committed = run_java5(["transaction", door.endpoints, topic, 2, "commit"])
        rolled_back = run_java5(["transaction", door.endpoints, topic, 1, "rollback"])
        orphan = run_java5(["transaction", door.endpoints, topic, 1, "die"], returncode=9)
        second = run_java5(["transaction", door.endpoints, topic, 0, "commit", 40], timeout=120)
        got = of(run_java5(["receive", door.endpoints, topic, group, 3, 30]), "received")
        names = {e["id"]: f"{label}:{e['body']}" for label, events in
                 (("committed", committed), ("rolled back", rolled_back), ("orphan", orphan))
                 for e in of(events, "half")}  # fmt: skip
        return {
            "ended": [len(of(committed, "ended")), len(of(rolled_back, "ended"))],
            "checked": sorted({names.get(e["id"], "other") for e in of(second, "checked")}),
            "delivered": dict(sorted(collections.Counter(names.get(e["id"], "other") for e in got).items())),
        }

    compare(
        "transactions: commit, rollback, an orphan checked",
        doors,
        observe,
        {
            "checked": EARLY_CHECKS,
            # The second producer's checker answers COMMIT to every check, those of ended transactions too.
            "delivered": f"the early checks above, answered COMMIT, and: {SECOND_DECISION}",
        },
    )


# -- full: push consumers, FIFO, delay ---------------------------------------------------------------------------------


@full_only
def test_push_consumer_retries_then_dead_letter(doors: dict[str, Endpoint]) -> None:
    """A listener that always fails, in a group with retryMaxTimes 1: the attempts it sees, then the message in
    %DLQ%<group> (read through the 4.x door, whose reading both brokers share)."""

    def observe(door: Endpoint) -> dict[str, Any]:
        topic, group = _name("Ref5Dlq"), _name("Ref5DlqG")
        create_topic(door, topic, "NORMAL")
        create_group(door, group, retry_max_times=1)
        sent = of(run_java5(["produce", door.endpoints, topic, 1]), "sent")
        consumed = of(run_java5(["push", door.endpoints, topic, group, 3, 25, "fail"], timeout=120), "consumed")
        dead = pull_all(door.cluster, f"%DLQ%{group}", settle=3.0)
        return {
            "attempts": [(e["body"], e["attempt"]) for e in consumed],
            "same message each attempt": {e["id"] for e in consumed} == {sent[0]["id"]},
            "dead letters": sorted(m.body.decode() for m in dead),
        }

    compare("push consumer: retries, then the DLQ", doors, observe)


@full_only
def test_fifo_message_groups(doors: dict[str, Endpoint]) -> None:
    """Six messages in three message groups to a FIFO topic, consumed by an orderly group's push consumer: the order
    within each message group."""

    def observe(door: Endpoint) -> dict[str, Any]:
        topic, group = _name("Ref5Fifo"), _name("Ref5FifoG")
        create_topic(door, topic, "FIFO")
        create_group(door, group, orderly=True)
        run_java5(["produce", door.endpoints, topic, 6, "order-{k}"])
        consumed = of(run_java5(["push", door.endpoints, topic, group, 6, 40], timeout=120), "consumed")
        order: dict[str, list[str]] = collections.defaultdict(list)
        for e in consumed:
            order[e["group"]].append(e["body"])
        return {"order per message group": dict(sorted(order.items())), "count": len(consumed)}

    compare("FIFO message groups", doors, observe)


@full_only
def test_delivery_timestamp(doors: dict[str, Endpoint]) -> None:
    """Two messages with a delivery time 3 s ahead: not before, then both."""

    def observe(door: Endpoint) -> dict[str, Any]:
        topic, group = _name("Ref5Delay"), _name("Ref5DelayG")
        create_topic(door, topic, "DELAY")
        create_group(door, group)
        started = time.time()
        sent = of(run_java5(["produce", door.endpoints, topic, 2, "-", 3000]), "sent")
        got = of(run_java5(["receive", door.endpoints, topic, group, 2, 30]), "received")
        due = {e["id"]: e["deliverAt"] for e in sent}
        return {
            "delivered": bodies(got),
            "none before its time": all(e["at"] >= due[e["id"]] for e in got),
            "seconds until the last": round(max((e["at"] for e in got), default=started) - started, 1),
        }

    compare("delivery timestamp", doors, observe, report_only={"seconds until the last"})
