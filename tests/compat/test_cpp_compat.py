"""The official C++ client (PyPI `rocketmq`) against `txmq dev`: every send mode, push and pull consumers.

Each client runs in its own process from `.venv-cpp`. Nothing is mocked: the broker is a real child process.
"""

from __future__ import annotations

import collections
import time
import uuid

import pytest

from .cpp_client import cpp_processes, run_cpp

pytestmark = pytest.mark.slow

COUNT = 20


@pytest.fixture
def cpp():
    with cpp_processes() as start:
        yield start


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _produce(ns: str, topic: str, mode: str, count: int = COUNT, *extra: str) -> list[dict]:
    events = run_cpp(
        [
            "produce",
            "--namesrv",
            ns,
            "--topic",
            topic,
            "--count",
            str(count),
            "--mode",
            mode,
            "--body-prefix",
            f"{mode}-",
            "--tag",
            "TagA",
            "--keys",
            f"{mode}-key-{{i}}",
            *extra,
        ],
        timeout=90,
    )
    summary = events[-1]
    assert summary["event"] == "summary" and summary["sent"] == count and summary["failed"] == 0, summary
    return [e for e in events if e["event"] == "sent"]


def _assert_exactly_once(received: list[dict], expected_bodies: set[str]) -> None:
    bodies = collections.Counter(e["body"] for e in received)
    duplicates = {b: n for b, n in bodies.items() if n > 1}
    assert not duplicates, f"delivered more than once: {duplicates}"
    assert set(bodies) == expected_bodies, f"missing {sorted(expected_bodies - set(bodies))[:5]}"


def test_every_send_mode_is_consumed_once_by_a_clustering_push_consumer(txmq_cluster, cpp) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = _name("CppModes")
    expected: set[str] = set()
    for mode in ("sync", "async", "oneway", "orderly", "batch"):
        sent = _produce(ns, topic, mode, COUNT, "--sharding-key-mod", "3")
        assert len(sent) == COUNT
        if mode == "sync":
            assert all(e["status"] == "OK" and e["msg_id"] for e in sent)
        expected |= {f"{mode}-{i}" for i in range(COUNT)}
    consumer = cpp(
        [
            "consume",
            "--namesrv",
            ns,
            "--topic",
            topic,
            "--group",
            _name("cg"),
            "--expect",
            str(len(expected)),
            "--timeout",
            "90",
            "--linger",
            "2",
        ]
    )
    assert consumer.wait(150) == 0, consumer.events[-3:]
    received = consumer.received()
    _assert_exactly_once(received, expected)
    assert all(e["tags"] == "TagA" for e in received)
    assert all(e["topic"] == topic for e in received)
    # Orderly sends with the same sharding key land in one queue, in send order.
    orderly = [e for e in received if e["body"].startswith("orderly-")]
    by_key: dict[int, list[dict]] = collections.defaultdict(list)
    for e in orderly:
        by_key[int(e["body"].split("-")[1]) % 3].append(e)
    for events in by_key.values():
        assert len({e["queue_id"] for e in events}) == 1
        ordered = sorted(events, key=lambda e: e["queue_offset"])
        assert [int(e["body"].split("-")[1]) for e in ordered] == sorted(int(e["body"].split("-")[1]) for e in events)


def test_broadcasting_consumers_each_get_every_message(txmq_cluster, cpp) -> None:
    ns = txmq_cluster.namesrv_addr
    topic, group = _name("CppBroadcast"), _name("bg")
    consumers = [
        cpp(
            [
                "consume",
                "--namesrv",
                ns,
                "--topic",
                topic,
                "--group",
                group,
                "--mode",
                "broadcasting",
                "--expect",
                "100000",
                "--timeout",
                "120",
            ]
        )
        for _ in range(2)
    ]
    # Broadcasting consumers with no local offsets start at the queues' ends, as in RocketMQ: warm up until both
    # receive, then send the messages that count.
    deadline = time.monotonic() + 60
    while not all(c.received() for c in consumers):
        assert time.monotonic() < deadline, "broadcasting consumers never started receiving"
        run_cpp(["produce", "--namesrv", ns, "--topic", topic, "--count", "4", "--body-prefix", "warmup-"])
        time.sleep(0.5)
    _produce(ns, topic, "sync", 10)
    for consumer in consumers:
        consumer.wait_for(lambda e: e.get("event") == "received" and e["body"].startswith("sync-"), 60, count=10)
    time.sleep(2)  # a duplicate would show up now
    for consumer in consumers:
        consumer.stop()
        real = [e for e in consumer.received() if e["body"].startswith("sync-")]
        _assert_exactly_once(real, {f"sync-{i}" for i in range(10)})


def test_pull_consumer_reads_every_message(txmq_cluster) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = _name("CppPull")
    _produce(ns, topic, "sync", COUNT)
    events = run_cpp(
        ["pull", "--namesrv", ns, "--topic", topic, "--group", _name("pg"), "--expect", str(COUNT), "--timeout", "60"],
        timeout=90,
    )
    received = [e for e in events if e["event"] == "received"]
    _assert_exactly_once(received, {f"sync-{i}" for i in range(COUNT)})


def test_tag_filtering_by_expression(txmq_cluster, cpp) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = _name("CppTags")
    run_cpp(["produce", "--namesrv", ns, "--topic", topic, "--count", "10", "--tag", "TagA", "--body-prefix", "a-"])
    run_cpp(["produce", "--namesrv", ns, "--topic", topic, "--count", "10", "--tag", "TagB", "--body-prefix", "b-"])
    consumer = cpp(
        [
            "consume",
            "--namesrv",
            ns,
            "--topic",
            topic,
            "--group",
            _name("tg"),
            "--expression",
            "TagB",
            "--expect",
            "10",
            "--timeout",
            "60",
            "--linger",
            "2",
        ]
    )
    assert consumer.wait(90) == 0
    _assert_exactly_once(consumer.received(), {f"b-{i}" for i in range(10)})


def test_compressed_batch_over_4kib_is_split_and_stored(txmq_cluster) -> None:
    """The C++ client zlib-compresses a whole batch body over 4 KiB; every entry must come out intact."""
    ns = txmq_cluster.namesrv_addr
    topic = _name("CppBigBatch")
    _produce(ns, topic, "batch", 12, "--body-size", "700")
    events = run_cpp(
        ["pull", "--namesrv", ns, "--topic", topic, "--group", _name("pg"), "--expect", "12", "--timeout", "60"],
        timeout=90,
    )
    received = [e for e in events if e["event"] == "received"]
    assert sorted(e["body_len"] for e in received) == [700] * 12
    _assert_exactly_once(received, {e["body"] for e in received})
    assert {e["body"][:8] for e in received} >= {"batch-0x", "batch-1x"}
