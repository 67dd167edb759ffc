"""Commit-log records, properties, batches and message ids, byte for byte."""

from __future__ import annotations

import dataclasses
import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import RecordDecodeError, TxmqError
from txmq.protocol.record import (
    BLANK_MAGIC_CODE,
    MAGIC_CODE,
    BatchEntry,
    MessageRecord,
    SysFlag,
    TransactionType,
    UniqKeyGenerator,
    body_crc,
    decode_batch,
    decode_offset_msg_id,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch,
    encode_blank,
    encode_offset_msg_id,
    encode_properties,
    encode_record,
    java_string_hash,
    join_properties,
    needs_consume_queue,
    normalize_host,
    stamp_record,
    store_timestamp_pos,
    tags_code,
    transaction_type,
)

ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None).map(str)
ports = st.integers(0, 65535)
hosts = st.tuples(st.one_of(ipv4, ipv6), ports)
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)

records = st.builds(
    MessageRecord,
    topic=st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC%_-|0123456789", min_size=1, max_size=127),
    body=st.binary(max_size=2048),
    queue_id=i32,
    flag=i32,
    queue_offset=i64,
    physical_offset=i64,
    sys_flag=st.integers(0, 0xF) | st.sampled_from([0x100, 0x301, 0x4, 0x8, 0xC]),
    born_timestamp=i64,
    born_host=hosts,
    store_timestamp=i64,
    store_host=hosts,
    reconsume_times=i32,
    prepared_transaction_offset=i64,
    properties=st.dictionaries(prop_text, prop_text, max_size=8),
)


def _normalised(rec: MessageRecord) -> MessageRecord:
    """What a decode gives back: V6 bits derived from the hosts, CRC and size filled in."""
    # Plain ints: ~ of an IntFlag keeps only the defined bits and would drop the compression type (0x100..0x700).
    flag = rec.sys_flag & ~int(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
    if ":" in rec.born_host[0]:
        flag |= SysFlag.BORNHOST_V6
    if ":" in rec.store_host[0]:
        flag |= SysFlag.STOREHOST_V6
    rec.sys_flag = flag
    return rec


@given(records)
@settings(max_examples=300)
def test_any_record_round_trips(rec: MessageRecord) -> None:
    data = encode_record(rec)
    decoded = decode_record(data)
    expected = _normalised(rec)
    assert decoded.store_size == len(data)
    assert decoded.body_crc == body_crc(rec.body)
    for name in [f.name for f in dataclasses.fields(MessageRecord)]:
        if name in ("body_crc", "store_size", "born_host", "store_host"):
            continue
        assert getattr(decoded, name) == getattr(expected, name), name
    assert normalize_host(decoded.born_host) == normalize_host(rec.born_host)
    assert normalize_host(decoded.store_host) == normalize_host(rec.store_host)
    # Re-encoding the decoded record gives the same bytes.
    assert encode_record(decoded) == data


def test_ipv4_layout_matches_rocketmq_offsets() -> None:
    rec = MessageRecord(
        topic="TopicTest",
        body=b"hello",
        queue_id=3,
        flag=7,
        queue_offset=11,
        physical_offset=12345,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.5", 52000),
        store_timestamp=1_700_000_000_123,
        store_host=("10.0.0.1", 10911),
        reconsume_times=2,
        prepared_transaction_offset=99,
        properties={"TAGS": "TagA", "UNIQ_KEY": "ABC"},
    )
    data = bytes(encode_record(rec))
    props = b"TAGS\x01TagA\x02UNIQ_KEY\x01ABC"
    assert len(data) == 91 + 5 + len("TopicTest") + len(props)
    fields = struct.unpack_from(">iIiiiqqiq", data, 0)
    assert fields == (
        len(data),
        MAGIC_CODE,
        zlib.crc32(b"hello") & 0x7FFFFFFF,
        3,
        7,
        11,
        12345,
        0,
        1_700_000_000_000,
    )
    assert struct.unpack_from(">i", data, 4) == (-626843481,)
    assert data[48:52] == bytes([10, 0, 0, 5]) and struct.unpack_from(">i", data, 52) == (52000,)
    assert struct.unpack_from(">q", data, 56) == (1_700_000_000_123,)
    assert data[64:68] == bytes([10, 0, 0, 1]) and struct.unpack_from(">i", data, 68) == (10911,)
    assert struct.unpack_from(">iqi", data, 72) == (2, 99, 5)
    assert data[88:93] == b"hello"
    assert data[93] == 9 and data[94:103] == b"TopicTest"
    assert struct.unpack_from(">H", data, 103) == (len(props),)
    assert data[105:] == props


def test_stamp_record_writes_offsets_and_store_time() -> None:
    for host in (("10.0.0.5", 1), ("::1", 2)):
        rec = MessageRecord(topic="T", body=b"x", born_host=host)
        buf = bytearray(b"pad") + encode_record(rec)
        stamp_record(buf, 3, 42, 4242, 1_234_567)
        got = decode_record(buf, 3)
        assert (got.queue_offset, got.physical_offset, got.store_timestamp) == (42, 4242, 1_234_567)
        assert store_timestamp_pos(got.sys_flag) == (68 if ":" in host[0] else 56)


def test_properties_tolerate_cpp_trailing_separator_and_junk() -> None:
    assert decode_properties("TAGS\x01A\x02KEYS\x01k1 k2\x02") == {"TAGS": "A", "KEYS": "k1 k2"}
    assert decode_properties("a\x01b\x02\x02x\x02noval\x01\x02\x01v\x02KEY\x01v1\x02KEY\x01v2") == {
        "a": "b",
        "KEY": "v2",
    }
    assert encode_properties({"a": "1", "b": "", "c": "3"}) == "a\x011\x02c\x013"
    assert decode_properties("") == {}


@given(st.dictionaries(prop_text, prop_text, max_size=10))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props
    assert decode_properties(encode_properties(props) + "\x02") == props


def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("*") == 42
    assert java_string_hash("") == 0
    # Overflow wraps to a negative int32 as in Java ("polygenelubricants".hashCode() == Integer.MIN_VALUE).
    assert java_string_hash("polygenelubricants") == -(2**31)
    # Supplementary characters count as two UTF-16 code units: "\U0001F600" is "\uD83D\uDE00".
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00
    assert tags_code(None) == 0 and tags_code("TagA") == 2598919


def test_transaction_types() -> None:
    assert transaction_type(0x4 | 0x1) is TransactionType.PREPARED
    assert needs_consume_queue(0) and needs_consume_queue(0x8 | 0x2)
    assert not needs_consume_queue(0x4) and not needs_consume_queue(0xC)


def test_offset_msg_id_round_trip_and_format() -> None:
    msg_id = encode_offset_msg_id(("127.0.0.1", 10911), 1234)
    assert msg_id == "7F00000100002A9F00000000000004D2"
    assert decode_offset_msg_id(msg_id) == (("127.0.0.1", 10911), 1234)
    v6 = encode_offset_msg_id(("::1", 10911), 7)
    assert len(v6) == 56 and decode_offset_msg_id(v6) == (("::1", 10911), 7)
    assert decode_offset_msg_id(encode_offset_msg_id(("::ffff:1.2.3.4", 5), 6)) == (("1.2.3.4", 5), 6)
    for bad in ("", "XYZ", "7F000001", "G" * 32):
        with pytest.raises(RecordDecodeError):
            decode_offset_msg_id(bad)


def test_uniq_keys_are_unique_and_well_formed() -> None:
    gen = UniqKeyGenerator(ip="10.1.2.3", pid=77, token=5)
    keys = [gen.next(now_ms=1_700_000_000_000 + i // 10) for i in range(5000)]
    assert len(set(keys)) == len(keys)
    assert all(len(k) == 32 and k == k.upper() and int(k, 16) >= 0 for k in keys)
    assert keys[0].startswith("0A010203" + "004D" + "00000005")


batch_entries = st.lists(
    st.builds(
        BatchEntry,
        body=st.binary(max_size=512),
        flag=i32,
        properties=st.dictionaries(prop_text, prop_text, max_size=4).map(encode_properties),
    ),
    min_size=1,
    max_size=20,
)


@given(batch_entries)
def test_any_batch_body_round_trips(entries: list[BatchEntry]) -> None:
    assert decode_batch(encode_batch(entries)) == entries


def test_join_properties_adds_one_separator() -> None:
    assert join_properties("a\x011", "CLUSTER\x01c") == "a\x011\x02CLUSTER\x01c"
    assert join_properties("a\x011\x02", "CLUSTER\x01c") == "a\x011\x02CLUSTER\x01c"
    assert join_properties("", "CLUSTER\x01c") == "CLUSTER\x01c"
    assert join_properties("a\x011", "") == "a\x011"


def test_decode_records_reads_a_run_and_blank_is_rejected() -> None:
    run = b"".join(bytes(encode_record(MessageRecord(topic="T", body=bytes([i]) * i))) for i in range(5))
    assert [r.body for r in decode_records(run)] == [bytes([i]) * i for i in range(5)]
    blank = encode_blank(64)
    assert struct.unpack_from(">iI", blank) == (64, BLANK_MAGIC_CODE)
    with pytest.raises(RecordDecodeError, match="blank"):
        decode_record(blank)


def test_corrupt_body_fails_crc_check() -> None:
    data = encode_record(MessageRecord(topic="T", body=b"payload"))
    data[88] ^= 0xFF
    with pytest.raises(RecordDecodeError, match="CRC"):
        decode_record(data)
    assert decode_record(data, check_crc=False).body[1:] == b"ayload"


def _valid_record() -> bytes:
    return bytes(encode_record(MessageRecord(topic="Topic", body=b"b" * 30, properties={"TAGS": "t"})))


@given(st.binary(max_size=300))
@settings(max_examples=500)
def test_random_bytes_raise_only_txmq_errors(data: bytes) -> None:
    for decoder in (decode_record, decode_batch, decode_records):
        try:
            decoder(data)
        except TxmqError:
            pass


@given(st.data())
@settings(max_examples=500)
def test_mutated_records_raise_only_txmq_errors(data: st.DataObject) -> None:
    buf = bytearray(_valid_record())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    for candidate in (bytes(buf), bytes(buf[:cut])):
        try:
            decode_record(candidate)
        except TxmqError:
            pass
        try:
            decode_batch(candidate)
        except TxmqError:
            pass


def test_lengths_past_the_end_are_clear_errors() -> None:
    rec = bytearray(_valid_record())
    struct.pack_into(">i", rec, 0, 10_000)
    with pytest.raises(RecordDecodeError, match="runs past"):
        decode_record(rec)
    rec = bytearray(_valid_record())
    struct.pack_into(">i", rec, 84, 2**31 - 1)  # body length
    with pytest.raises(RecordDecodeError):
        decode_record(rec)
    rec = bytearray(_valid_record())
    struct.pack_into(">I", rec, 4, 0x12345678)
    with pytest.raises(RecordDecodeError, match="magic"):
        decode_record(rec)
    rng = random.Random(7)
    for _ in range(200):
        blob = bytearray(_valid_record())
        struct.pack_into(">i", blob, rng.randrange(0, len(blob) - 4), rng.randrange(-(2**31), 2**31))
        try:
            decode_record(blob)
        except TxmqError:
            pass
