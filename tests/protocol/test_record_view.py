"""The lazy record view and the segment walker against the eager decoder (Hypothesis)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# The generators of the eager codec's tests: every field, IPv4 and IPv6 hosts, any properties.
from test_record import hosts, prop_text, records

from txmq.errors import RecordDecodeError
from txmq.protocol.record import (
    MessageRecord,
    RecordView,
    WalkResult,
    body_len_pos,
    decode_record,
    encode_blank,
    encode_parts,
    encode_record,
    stamp_record,
    walk_segment,
)

FIELDS = [f.name for f in dataclasses.fields(MessageRecord)]


@given(records, st.binary(max_size=16))
@settings(max_examples=300)
def test_every_field_of_the_lazy_view_equals_the_eager_decode(rec: MessageRecord, prefix: bytes) -> None:
    data, sys_flag = encode_parts(rec)
    buf = prefix + bytes(data) + b"tail"
    eager = decode_record(buf, len(prefix))
    view = RecordView(buf, len(prefix), check_crc=True)
    assert view.sys_flag == sys_flag == eager.sys_flag
    for name in FIELDS:
        assert getattr(view, name) == getattr(eager, name), name
    assert view.to_record() == eager
    assert view.raw() == bytes(data)
    assert view.tags == eager.tags and view.keys == eager.keys and view.uniq_key == eager.uniq_key
    assert view.offset_msg_id == eager.offset_msg_id
    assert view.transaction_type == eager.transaction_type
    for key, value in eager.properties.items():
        assert RecordView(buf, len(prefix)).get(key) == value  # without the map


@given(records)
@settings(max_examples=100)
def test_encode_record_and_encode_parts_give_the_same_bytes(rec: MessageRecord) -> None:
    assert encode_record(rec) == encode_parts(rec)[0]


def test_the_view_checks_structure_and_crc_only_when_asked() -> None:
    data = encode_record(MessageRecord(topic="T", body=b"payload"))
    data[body_len_pos(0) + 4] ^= 0xFF  # the body's first byte
    view = RecordView(data)
    assert not view.crc_ok()
    with pytest.raises(RecordDecodeError, match="CRC"):
        RecordView(data, check_crc=True)
    with pytest.raises(RecordDecodeError, match="runs past"):
        RecordView(bytes(data[:-1]))


def _segment(recs: list[MessageRecord], base: int) -> tuple[bytearray, list[tuple[int, int]]]:
    """Records laid out as the writer does: offsets and store time stamped, PHYSICALOFFSET = base + position."""
    buf = bytearray()
    spans = []
    for i, rec in enumerate(recs):
        data = encode_record(rec)
        stamp_record(data, 0, i, base + len(buf), 1_700_000_000_000 + i)
        spans.append((base + len(buf), len(data)))
        buf += data
    return buf, spans


small_records = st.builds(
    MessageRecord,
    topic=st.sampled_from(["T", "TopicB", "%RETRY%g"]),
    body=st.binary(max_size=64),
    born_host=hosts,
    store_host=hosts,
    properties=st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY"]), prop_text, max_size=3),
)


@given(st.lists(small_records, max_size=12), st.data())
@settings(max_examples=200)
def test_the_walker_yields_every_whole_record_and_stops_at_a_torn_tail(
    recs: list[MessageRecord], data: st.DataObject
) -> None:
    base = data.draw(st.sampled_from([0, 1 << 20]))
    buf, spans = _segment(recs, base)
    tail = data.draw(st.sampled_from(["zeros", "torn", "garbage", "blank"]))
    if tail == "torn":  # a record cut after its first 8 bytes and before its body's end (a crash mid-write)
        # (a cut inside the properties is invisible to any reader: no CRC covers them, as in RocketMQ)
        extra = bytes(encode_record(MessageRecord(topic="Torn", body=b"x" * 40)))
        cut = data.draw(st.integers(8, body_len_pos(0) + 4 + 40 - 1))
        buf += extra[:cut]
    elif tail == "garbage":
        buf += data.draw(st.binary(min_size=8, max_size=8).filter(lambda b: b[:4] != b"\0\0\0\0" or b[4:] != bytes(4)))
    room = 256
    if tail == "blank":
        buf += encode_blank(room)
    else:
        buf += bytes(room)
    end = base + sum(n for _, n in spans)
    res = WalkResult()
    got = list(walk_segment(buf, base=base, result=res))
    assert [(g[0], g[1]) for g in got] == spans
    assert [g[5] for g in got] == [1_700_000_000_000 + i for i in range(len(recs))]
    assert [g[6].decode() for g in got] == [r.topic for r in recs]
    assert res.records == len(recs) and res.end == end
    assert res.clean_end == (tail in ("zeros", "blank")), res.reason
    assert res.blank == (tail == "blank")
    # Views see the same records as the eager decoder.
    views = list(walk_segment(buf, base=base, views=True))
    assert [v.to_record() for v in views] == [decode_record(buf, p - base) for p, _ in spans]


@given(st.lists(small_records, min_size=2, max_size=10), st.data())
@settings(max_examples=100)
def test_the_walker_skips_a_bad_crc_only_when_asked(recs: list[MessageRecord], data: st.DataObject) -> None:
    recs = [MessageRecord(topic=r.topic, body=r.body + b"!", properties=r.properties) for r in recs]
    buf, spans = _segment(recs, 0)
    buf += bytes(64)
    k = data.draw(st.integers(0, len(spans) - 1))
    start = spans[k][0]
    buf[start + body_len_pos(RecordView(buf, start).sys_flag) + 4] ^= 0xFF  # the body's first byte
    res = WalkResult()
    assert [g[0] for g in walk_segment(buf, result=res)] == [p for p, _ in spans[:k]]
    assert not res.clean_end and "CRC" in res.reason and res.end == spans[k][0]
    skipped: list[int] = []
    res = WalkResult()
    got = [
        g[0] for g in walk_segment(buf, skip_bad_crc=True, on_skip=lambda p, _size, _why: skipped.append(p), result=res)
    ]
    assert got == [p for i, (p, _) in enumerate(spans) if i != k]
    assert skipped == [spans[k][0]] and res.skipped == 1 and res.clean_end


def test_the_walker_hops_to_a_range_and_stops_at_its_end() -> None:
    recs = [MessageRecord(topic="T", body=bytes([i]) * 50) for i in range(10)]
    buf, spans = _segment(recs, 4096)
    buf += bytes(64)
    lo, hi = spans[3][0] + 1, spans[7][0] + 1  # records starting in [lo, hi)
    got = [v.physical_offset for v in walk_segment(buf, base=4096, hop_to=lo, stop_at=hi, views=True)]
    assert got == [p for p, _ in spans[4:8]]
