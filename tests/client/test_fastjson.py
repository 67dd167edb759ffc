"""The tolerant fastjson reader and the stats parsers built on it."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.client import fastjson
from txmq.client.admin import parse_consume_stats, parse_mq_table, parse_topic_stats
from txmq.client.message import MessageQueue

CONSUME_STATS_FASTJSON = (
    b'{"consumeTps":1.5,"offsetTable":{'
    b'{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":1700},'
    b'{"brokerName":"broker-a","queueId":1,"topic":"T"}:{"brokerOffset":3,"consumerOffset":3,"lastTimestamp":0}}}'
)


def test_object_keys_become_hashable_frozen_dicts() -> None:
    data = fastjson.loads(CONSUME_STATS_FASTJSON)
    keys = list(data["offsetTable"])
    assert keys[0] == {"brokerName": "broker-a", "queueId": 0, "topic": "T"}
    assert isinstance(keys[0], fastjson.FrozenDict)
    assert hash(keys[0]) == hash(fastjson.FrozenDict({"topic": "T", "queueId": 0, "brokerName": "broker-a"}))
    with pytest.raises(TypeError):
        keys[0]["topic"] = "X"  # type: ignore[index]


def test_consume_stats_from_fastjson_object_keys() -> None:
    stats = parse_consume_stats(CONSUME_STATS_FASTJSON)
    q0 = MessageQueue("T", "broker-a", 0)
    assert stats.offset_table[q0].broker_offset == 10
    assert stats.offset_table[q0].consumer_offset == 4
    assert stats.consume_tps == 1.5
    assert stats.diff_total == 6


def test_consume_stats_from_the_broker_writer() -> None:
    """What txmq's own broker writes parses back (its writer lives in txmq.broker.fastjson)."""
    from txmq.broker.fastjson import mq_key, with_object_map

    body = with_object_map(
        "offsetTable",
        [(mq_key("T", "b", 2), {"brokerOffset": 5, "consumerOffset": 1, "lastTimestamp": 9})],
        {"consumeTps": 0.0},
    )
    stats = parse_consume_stats(body)
    assert stats.offset_table == {MessageQueue("T", "b", 2): stats.offset_table[MessageQueue("T", "b", 2)]}
    assert stats.diff_total == 4


def test_standard_json_shapes_are_accepted_too() -> None:
    as_string_keys = orjson.dumps(
        {"offsetTable": {'{"brokerName":"b","queueId":3,"topic":"T"}': {"minOffset": 1, "maxOffset": 9}}}
    )
    assert parse_topic_stats(as_string_keys)[MessageQueue("T", "b", 3)].max_offset == 9
    as_pairs = [
        [{"brokerName": "b", "queueId": 1, "topic": "T"}, {"x": 1}],
        {"key": {"brokerName": "b", "queueId": 2, "topic": "T"}, "value": {"x": 2}},
    ]
    table = parse_mq_table(as_pairs)
    assert table == {MessageQueue("T", "b", 1): {"x": 1}, MessageQueue("T", "b", 2): {"x": 2}}
    assert parse_mq_table({"not-a-queue": 1, 7: 2}) == {}


def test_relaxed_syntax() -> None:
    assert fastjson.loads('{0:"10.0.0.1:10911",1:"x"}') == {0: "10.0.0.1:10911", 1: "x"}
    assert fastjson.loads("{'a':'b',}") == {"a": "b"}
    assert fastjson.loads('{bare:[1,2,],"n":-3.5e2,"l":12L}') == {"bare": [1, 2], "n": -350.0, "l": 12}
    assert fastjson.loads('{"s":"a\\u00e9\\n\\x41"}') == {"s": "a\u00e9\nA"}
    assert fastjson.loads(b"  [true, false, null]  ") == [True, False, None]
    assert fastjson.loads('{[1,2]:"pair"}') == {(1, 2): "pair"}


@pytest.mark.parametrize("bad", ['{"a":1', '{"a" 1}', "[1 2]", '"open', '{"a":1}}', "", "{:1}"])
def test_garbage_is_rejected_with_a_position(bad: str) -> None:
    with pytest.raises(fastjson.FastjsonError, match="character"):
        fastjson.loads(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_any_standard_json_reads_the_same_through_the_slow_path(value: object) -> None:
    text = orjson.dumps(value).decode()
    # Call the hand-written parser directly: loads() would take orjson's fast path for standard JSON.
    assert fastjson._Parser(text).parse() == value
