"""Message model, decoding of stored records, message ids, routes, and the local bookkeeping of consumers."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.client.admin import looks_like_offset_msg_id
from txmq.client.api import decode_messages
from txmq.client.message import Message, MessageExt, MessageQueue
from txmq.client.offset_store import LocalFileOffsetStore
from txmq.client.process_queue import ProcessQueue
from txmq.client.route import TopicRoute
from txmq.client.subscription import Subscription
from txmq.protocol.record import (
    MessageRecord,
    Prop,
    SysFlag,
    UniqKeyGenerator,
    encode_offset_msg_id,
    encode_record,
    java_string_hash,
)

# -- Message -------------------------------------------------------------------------------------------------------


def test_message_views_are_properties() -> None:
    m = Message("T", "héllo", tags="TagA", keys=["k1", "k2"], delay_level=3)
    assert m.body == "héllo".encode()
    assert m.properties[Prop.TAGS] == "TagA"
    assert m.properties[Prop.KEYS] == "k1 k2"
    assert m.keys == ["k1", "k2"]
    assert m.properties[Prop.DELAY] == "3" and m.delay_level == 3
    assert m.properties[Prop.WAIT] == "true"
    m.keys = "single"
    m.tags = None
    m.delay_level = 0
    assert m.keys == ["single"] and Prop.TAGS not in m.properties and Prop.DELAY not in m.properties
    assert Message("T", b"x", wait_store_msg_ok=False).wait_store_msg_ok is False


def test_user_properties_cannot_shadow_system_ones() -> None:
    m = Message("T", b"x")
    m.put_user_property("color", "red")
    assert m.user_properties == {"color": "red"}
    with pytest.raises(ValueError, match="reserved"):
        m.put_user_property("UNIQ_KEY", "forged")
    with pytest.raises(ValueError):
        m.put_user_property("empty", "")


def _record(**kw: object) -> MessageRecord:
    base: dict[str, object] = dict(
        topic="T",
        body=b"payload",
        queue_id=2,
        queue_offset=41,
        physical_offset=1234,
        born_timestamp=1000,
        born_host=("10.0.0.9", 5555),
        store_timestamp=2000,
        store_host=("10.0.0.1", 10911),
        reconsume_times=1,
        properties={Prop.UNIQ_KEY: "ABC", Prop.TAGS: "TagA", Prop.KEYS: "a b"},
    )
    base.update(kw)
    return MessageRecord(**base)  # type: ignore[arg-type]


def test_message_ext_from_records() -> None:
    raw = bytes(encode_record(_record())) + bytes(encode_record(_record(physical_offset=2000, queue_offset=42)))
    a, b = decode_messages(raw, "broker-x")
    assert isinstance(a, MessageExt)
    assert (a.topic, a.body, a.queue_id, a.queue_offset) == ("T", b"payload", 2, 41)
    assert a.msg_id == "ABC"
    assert a.offset_msg_id == encode_offset_msg_id(("10.0.0.1", 10911), 1234)
    assert a.commit_log_offset == 1234 and a.reconsume_times == 1
    assert a.born_host == ("10.0.0.9", 5555) and a.store_timestamp == 2000
    assert a.queue == MessageQueue("T", "broker-x", 2)
    assert a.tags == "TagA" and a.keys == ["a", "b"]
    assert b.queue_offset == 42
    assert Prop.WAIT not in a.properties  # stored messages keep exactly their stored properties


def test_compressed_bodies_are_inflated_and_ids_fall_back() -> None:
    body = b"z" * 10_000
    rec = _record(body=zlib.compress(body), sys_flag=SysFlag.COMPRESSED, properties={})
    (m,) = decode_messages(bytes(encode_record(rec)))
    assert m.body == body
    assert m.msg_id == m.offset_msg_id  # no UNIQ_KEY: the offset id is the id
    rec = _record(body=zlib.compress(body), sys_flag=SysFlag.COMPRESSED | 0x300)  # Java 4.9.8 marks zlib as 0x300
    assert decode_messages(bytes(encode_record(rec)))[0].body == body


def test_offset_msg_ids_and_uniq_keys_are_told_apart() -> None:
    assert looks_like_offset_msg_id(encode_offset_msg_id(("127.0.0.1", 10911), 99))
    gen = UniqKeyGenerator("127.0.0.1", pid=4242, token=0xDEADBEEF)
    assert not looks_like_offset_msg_id(gen.next(1_700_000_000_000))
    assert not looks_like_offset_msg_id("not-hex")
    assert not looks_like_offset_msg_id("ABCD")


@given(st.integers(1, 0xFFFF), st.integers(0, 0xFFFFFFFF), st.integers(0, 2**40))
def test_uniq_keys_never_pass_for_offset_ids_unless_their_pid_bytes_are_zero(pid: int, token: int, now: int) -> None:
    key = UniqKeyGenerator("10.1.2.3", pid=pid, token=token).next(now)
    assert len(key) == 32
    assert not looks_like_offset_msg_id(key)


# -- routes ---------------------------------------------------------------------------------------------------------


ROUTE = (
    b'{"orderTopicConf":null,"queueDatas":['
    b'{"brokerName":"b","readQueueNums":2,"writeQueueNums":3,"perm":6,"topicSynFlag":0},'
    b'{"brokerName":"a","readQueueNums":2,"writeQueueNums":2,"perm":4},'
    b'{"brokerName":"c","readQueueNums":1,"writeQueueNums":1,"perm":6}],'
    b'"brokerDatas":[{"cluster":"C","brokerName":"a","brokerAddrs":{0:"h:1"}},'
    b'{"cluster":"C","brokerName":"b","brokerAddrs":{"0":"h:2","1":"h:3"}},'
    b'{"cluster":"C","brokerName":"c","brokerAddrs":{"1":"h:4"}}],"filterServerTable":{}}'
)


def test_route_parsing_and_derived_queues() -> None:
    route = TopicRoute.parse("T", ROUTE)  # unquoted numeric keys, as older name servers send
    assert route.broker("b").broker_addrs == {0: "h:2", 1: "h:3"}  # type: ignore[union-attr]
    # a: read-only; c: no master -> only b publishes
    assert route.publish_queues() == [MessageQueue("T", "b", i) for i in range(3)]
    subs = route.subscribe_queues()
    assert subs == sorted(subs)
    assert {q.broker_name for q in subs} == {"a", "b", "c"}
    assert route.master_addrs() == ["h:1", "h:2"]
    borrowed = route.as_topic("New", 1)
    assert borrowed.topic == "New" and borrowed.publish_queues() == [MessageQueue("New", "b", 0)]


def test_order_topic_conf_fixes_the_publish_queues() -> None:
    route = TopicRoute.parse("T", ROUTE)
    route.order_topic_conf = "x:2;y:1"
    assert route.publish_queues() == [MessageQueue("T", "x", 0), MessageQueue("T", "x", 1), MessageQueue("T", "y", 0)]


def test_subscription_parsing() -> None:
    s = Subscription.parse("T", " TagA || TagB ||", 5)
    assert s.tags == {"TagA", "TagB"} and s.matches("TagA") and not s.matches("TagC") and not s.matches(None)
    data = s.to_json()
    assert data["codeSet"] == [java_string_hash("TagA"), java_string_hash("TagB")] and data["subVersion"] == 5
    assert Subscription.parse("T", "*", 0).matches(None)
    assert Subscription.parse("T", "", 0).expression == "*"


# -- process queue and offsets --------------------------------------------------------------------------------------


def _msgs(*offsets: int) -> list[MessageExt]:
    return [MessageExt("T", b"x" * 10, queue_offset=o) for o in offsets]


def test_commit_offset_never_passes_an_unconsumed_message() -> None:
    pq = ProcessQueue()
    m = _msgs(10, 11, 12, 13)
    assert pq.put(m) == m
    assert pq.put(_msgs(12)) == []  # a re-pulled duplicate is not handed out twice
    assert pq.remove([m[1], m[3]]) == 10  # 10 is still being consumed
    assert pq.remove([m[0]]) == 12
    assert pq.remove([m[2]]) == 14  # nothing left: one past the last seen
    assert ProcessQueue().commit_offset() == -1


def test_orderly_take_put_back_keeps_the_order() -> None:
    pq = ProcessQueue()
    pq.put(_msgs(5, 6, 7, 8))
    first = pq.take(2)
    assert [x.queue_offset for x in first] == [5, 6]
    assert pq.commit_offset() == 5
    assert [x.queue_offset for x in pq.put_back()] == [5, 6]
    assert [x.queue_offset for x in pq.take(3)] == [5, 6, 7]
    assert pq.commit() == 8
    assert [x.queue_offset for x in pq.take(5)] == [8]
    assert pq.commit() == 9 and pq.is_empty()


def test_flow_control_thresholds() -> None:
    pq = ProcessQueue()
    pq.put(_msgs(*range(5)))
    assert pq.over_threshold(4, 10**9)
    assert not pq.over_threshold(5, 10**9)
    assert pq.over_threshold(100, 49)


async def test_local_offset_file_round_trip(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "offsets" / "G.json"
    store = LocalFileOffsetStore(path)
    q = MessageQueue("T", "b", 1)
    assert await store.read(q) == -1
    store.update(q, 5)
    store.update(q, 3, increase_only=True)
    assert store.get(q) == 5
    await store.persist_all([q])
    again = LocalFileOffsetStore(path)
    assert await again.read(q) == 5
    again.update(q, 2)  # not increase-only: a reset may move back
    assert again.get(q) == 2
