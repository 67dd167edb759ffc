"""The broker's cache of compiled filters and its per-record test."""

from __future__ import annotations

import pytest

from txmq.broker.filters import ConsumerFilters, record_filter
from txmq.errors import FilterExpressionError
from txmq.protocol.record import MessageRecord, encode_record


def test_a_filter_compiles_once_per_group_topic_and_expression() -> None:
    filters = ConsumerFilters()
    first = filters.get("G", "T", "SQL92", "a > 5")
    assert filters.get("G", "T", "SQL92", "a > 5") is first
    assert filters.get("G", "T", "SQL92", "a > 6") is not first
    assert filters.get("G2", "T", "SQL92", "a > 5") is not first
    assert len(filters) == 3


def test_a_compile_error_is_cached_and_raised_each_time() -> None:
    filters = ConsumerFilters()
    with pytest.raises(FilterExpressionError) as first:
        filters.get("G", "T", "SQL92", "a >")
    with pytest.raises(FilterExpressionError) as second:
        filters.get("G", "T", "SQL92", "a >")
    assert second.value is first.value
    with pytest.raises(FilterExpressionError, match="unknown filter expression type 'SQL93'"):
        filters.get("G", "T", "SQL93", "a > 1")


def test_the_cache_is_bounded() -> None:
    filters = ConsumerFilters(max_entries=3)
    kept = filters.get("G", "T", "SQL92", "a = 0")
    for i in range(1, 10):
        filters.get("G", "T", "SQL92", f"a = {i}")
    assert len(filters) == 3
    assert filters.get("G", "T", "SQL92", "a = 0") is not kept  # evicted, compiled again


def test_the_record_test_sees_user_and_system_properties() -> None:
    record = MessageRecord(topic="T", body=b"x", properties={"TAGS": "TagA", "KEYS": "k1 k2", "price": "120"})
    data = bytes(encode_record(record))
    assert record_filter(ConsumerFilters().get("G", "T", "SQL92", "TAGS = 'TagA' AND price > 100"))(data)
    assert not record_filter(ConsumerFilters().get("G", "T", "SQL92", "price > 200"))(data)
    assert not record_filter(ConsumerFilters().get("G", "T", "SQL92", "TRUE"))(b"\x00" * 40)  # not a record
