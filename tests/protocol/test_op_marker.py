"""Op markers: several decisions per record (RocketMQ 5's batched op messages), txmq's per-decision properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.protocol.op_marker import UNKNOWN, MarkedDecision, marker_fields, parse_marker

Item = tuple[int, int, str, str, str | None, str | None]
decision_items = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.integers(0, 2**60),
        st.sampled_from(["COMMIT", "ROLLBACK", "DISCARD"]),
        st.sampled_from(["producer", "check", "operator", "broker", "recovery"]),
        st.one_of(st.none(), st.text("0123456789ABCDEF", min_size=32, max_size=32)),
        st.one_of(st.none(), st.text("0123456789ABCDEF", min_size=1, max_size=40)),
    ),
    min_size=1,
    max_size=20,
)


@given(decision_items)
def test_fields_parse_back_to_the_same_decisions(items: list[Item]) -> None:
    body, props = marker_fields(items)
    assert parse_marker(body, props) == [MarkedDecision(q, p, d, by, copy) for q, p, d, by, copy, _uniq in items]
    assert props.get("KEYS", "").split() == [uniq for *_, uniq in items if uniq]


def test_a_rocketmq_marker_decides_unknown_for_each_offset() -> None:
    assert parse_marker(b"7", {"TAGS": "d"}) == [MarkedDecision(7, None, UNKNOWN, None, None)]
    assert [m.half_queue_offset for m in parse_marker(b"3,4,9", {})] == [3, 4, 9]


def test_properties_that_do_not_match_the_body_are_ignored() -> None:
    marked = parse_marker(b"1,2", {"TXMQ_DECISION": "COMMIT", "TXMQ_HALF_PHYS": "10,20", "TXMQ_BY": "producer,check"})
    assert [(m.half_phys, m.decision, m.by) for m in marked] == [(10, UNKNOWN, "producer"), (20, UNKNOWN, "check")]


@pytest.mark.parametrize("body", [b"", b"x", b"1,,y", b"\xff", b" , "])
def test_a_malformed_body_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_marker(body, {})
