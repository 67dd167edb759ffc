"""Pure selection rules: average rebalance allocation, send queue round-robin with broker avoidance, hash routing."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.client.message import Message, MessageQueue
from txmq.client.selection import RETRYABLE_SEND_CODES, QueueRoundRobin, allocate_averagely, select_by_hash


def queues(n: int, brokers: tuple[str, ...] = ("broker-a",)) -> list[MessageQueue]:
    return sorted(MessageQueue("T", b, i) for b in brokers for i in range(n))


def test_more_queues_than_consumers_gives_contiguous_blocks_extra_to_the_first() -> None:
    mqs = queues(8)
    cids = ["c1", "c2", "c3"]
    got = {c: allocate_averagely("G", c, mqs, cids) for c in cids}
    assert [q.queue_id for q in got["c1"]] == [0, 1, 2]
    assert [q.queue_id for q in got["c2"]] == [3, 4, 5]
    assert [q.queue_id for q in got["c3"]] == [6, 7]


def test_fewer_queues_than_consumers_leaves_the_last_consumers_idle() -> None:
    mqs = queues(2)
    cids = ["a", "b", "c", "d"]
    got = {c: allocate_averagely("G", c, mqs, cids) for c in cids}
    assert got == {"a": [mqs[0]], "b": [mqs[1]], "c": [], "d": []}


def test_equal_counts_one_queue_each() -> None:
    mqs = queues(2, ("broker-a", "broker-b"))
    cids = ["x", "y", "z", "zz"]
    assert [allocate_averagely("G", c, mqs, cids) for c in cids] == [[q] for q in mqs]


def test_consumer_missing_from_the_list_gets_nothing() -> None:
    assert allocate_averagely("G", "ghost", queues(4), ["a", "b"]) == []
    with pytest.raises(ValueError):
        allocate_averagely("G", "", queues(4), ["a"])


@given(n_queues=st.integers(0, 40), n_cids=st.integers(1, 12))
def test_allocation_is_a_partition_and_balanced(n_queues: int, n_cids: int) -> None:
    mqs = queues(n_queues)
    cids = sorted(f"cid-{i:02d}" for i in range(n_cids))
    parts = [allocate_averagely("G", c, mqs, cids) for c in cids]
    flat = [q for p in parts for q in p]
    assert sorted(flat) == mqs  # every queue exactly once
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra queues go to the first consumers


def test_round_robin_cycles_over_all_queues() -> None:
    mqs = queues(3, ("a", "b"))
    rr = QueueRoundRobin(start=0)
    picked = [rr.select(mqs) for _ in range(12)]
    assert Counter(picked) == {q: 2 for q in mqs}


def test_round_robin_avoids_brokers_that_failed_this_send() -> None:
    mqs = queues(2, ("a", "b", "c"))
    rr = QueueRoundRobin(start=0)
    for _ in range(20):
        assert rr.select(mqs, ["a"]).broker_name != "a"
        assert rr.select(mqs, ["a", "c"]).broker_name == "b"


def test_round_robin_falls_back_when_every_broker_failed() -> None:
    mqs = queues(2, ("a", "b"))
    rr = QueueRoundRobin(start=0)
    assert rr.select(mqs, ["a", "b"]) in mqs
    with pytest.raises(ValueError):
        rr.select([], [])


def test_retryable_codes_are_javas() -> None:
    assert {17, 14, 1, 16, 204, 205} == RETRYABLE_SEND_CODES
    assert 13 not in RETRYABLE_SEND_CODES  # MESSAGE_ILLEGAL: another broker would refuse it too


def test_hash_selector_matches_java_string_hashcode() -> None:
    mqs = queues(8)
    msg = Message("T", b"x")
    # "abc".hashCode() == 96354 in Java; 96354 % 8 == 2
    assert select_by_hash(mqs, msg, "abc") == mqs[2]
    # "order-1".hashCode() == -1207111310: abs() before the modulo
    assert select_by_hash(mqs, msg, "order-1") == mqs[1207111310 % 8]
    assert select_by_hash(mqs, msg, -3) == mqs[3]
    # Long.hashCode for values outside int32: (int)(v ^ (v >>> 32))
    assert select_by_hash(mqs, msg, 1 << 32) == mqs[1 % 8]
    same = {select_by_hash(mqs, msg, "user-42") for _ in range(5)}
    assert len(same) == 1
