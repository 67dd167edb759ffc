"""The fast scan of the ``transactions`` view (format ``txmq-store``) against the record decoder (Hypothesis).

Segments of every kind of record (half messages, op markers of one and several decisions, RocketMQ's markers,
resume records, malformed markers, committed deliveries, discard copies, plain messages, IPv6 hosts, odd property
values, bad CRCs, non-UTF-8 properties and topics) followed by zeros, a blank or garbage, are read through the
reader the audit uses (``TxmqStoreReader``: the driver's ranges, the compiled walker, Arrow columns) in ranges and
batches of any size, and compared row for row with rows built here from ``walk_segment`` and the checked record
decoder (``RecordView.to_record``), the way the view is specified (store_source.py's docstring, TX_COLUMNS). No
Spark session: the data source's reader runs as an executor runs it.
"""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.errors import RecordDecodeError
from txmq.protocol.op_marker import OP_TAG, PROP_DECISION, PROP_HALF_PHYS, RESUME_TAG, parse_marker
from txmq.protocol.record import (
    MessageRecord,
    Prop,
    RecordView,
    body_len_pos,
    encode_blank,
    encode_record,
    walk_segment,
)
from txmq.spark.store_source import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    TX_COLUMNS,
    TxmqStoreReader,
    commitlog_dir,
)

BASE = 1 << 30  # the segment's first commit-log offset (its file name)
V4 = ("10.0.0.7", 10911)
V6 = ("2001:db8::7", 10911)
NAME = st.text("abcXYZ_09", min_size=1, max_size=8)
INT_TEXT = st.sampled_from(["0", "3", "15", "-2", "+7", " 8", "x", "", "2147483648", "1_0", "²"]) | st.integers(
    -(2**40), 2**40
).map(str)


def _int32(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if -(2**31) <= value < 2**31 else None


def oracle_rows(rec: MessageRecord) -> list[tuple[Any, ...]]:
    """The rows of the ``transactions`` view for one decoded record (TX_COLUMNS' order)."""
    props = rec.properties
    phys = rec.physical_offset
    msg_id = rec.offset_msg_id
    uniq = props.get(Prop.UNIQ_KEY)
    several = props.get(Prop.TX_ID)
    seq = _int32(props.get(Prop.TX_SEQ)) if several else None
    born, stored = rec.born_timestamp, rec.store_timestamp
    if rec.topic == HALF_TOPIC:
        tx_id = several or props.get(Prop.TRANSACTION_ID) or uniq
        group, topic, qid = props.get(Prop.PGROUP), props.get(Prop.REAL_TOPIC), _int32(props.get(Prop.REAL_QID))
        return [("HALF", phys, phys, rec.queue_offset, group, topic, qid, None, tx_id, uniq, msg_id, None, None,
                 born, stored, seq)]  # fmt: skip
    if rec.topic == DISCARD_TOPIC:
        tx_id = props.get(Prop.TRANSACTION_ID) or uniq
        group, topic, qid = props.get(Prop.PGROUP), props.get(Prop.REAL_TOPIC), _int32(props.get(Prop.REAL_QID))
        checks = _int32(props.get(Prop.TRANSACTION_CHECK_TIMES))
        return [("DISCARD_COPY", phys, None, None, group, topic, qid, rec.queue_offset, tx_id, uniq, msg_id, None,
                 checks, born, stored, seq)]  # fmt: skip
    if rec.topic == OP_TOPIC:
        tag = props.get(Prop.TAGS)
        if tag not in (OP_TAG, RESUME_TAG):
            return []
        try:
            marked = parse_marker(rec.body, props)
        except ValueError:
            return []
        keys = (props.get(Prop.KEYS) or "").split(" ")
        if len(keys) != len(marked):
            keys = [uniq] * len(marked)  # type: ignore[list-item]
        kind = "OP" if tag == OP_TAG else "RESUME"
        return [
            (
                kind,
                phys,
                m.half_phys,
                m.half_queue_offset,
                None,
                None,
                None,
                rec.queue_offset,
                None,
                key or None,
                msg_id,
                m.decision if kind == "OP" else None,
                None,
                born,
                stored,
                None,
            )
            for m, key in zip(marked, keys, strict=True)
        ]
    if rec.sys_flag & 0xC == 0x8:
        tx_id = several or props.get(Prop.TRANSACTION_ID) or uniq
        return [("DELIVERY", phys, rec.prepared_transaction_offset, None, props.get(Prop.PGROUP), rec.topic,
                 rec.queue_id, rec.queue_offset, tx_id, uniq, msg_id, None, None, born, stored, seq)]  # fmt: skip
    return []


def _is_tx(view: RecordView) -> bool:
    return view.topic_bytes in (HALF_TOPIC.encode(), OP_TOPIC.encode(), DISCARD_TOPIC.encode()) or (
        view.sys_flag & 0xC == 0x8
    )


def expected_rows(path: str, lo: int, hi: int) -> list[tuple[Any, ...]]:
    """Rows of the records starting in ``[lo, hi)`` of the segment file, through the walker and the decoder; a
    transaction record that does not decode (not UTF-8) ends the segment, as the view says."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        return []
    out: list[tuple[Any, ...]] = []
    for view in walk_segment(data, base=BASE, tail_room=0, hop_to=BASE + lo, stop_at=BASE + hi, skip_bad_crc=True,
                             views=True):  # fmt: skip
        if not _is_tx(view):
            continue
        try:
            rec = view.to_record()
        except RecordDecodeError:
            break
        out.extend(oracle_rows(rec))
    return out


def reader_rows(store: str, split: int, batch_rows: int) -> list[tuple[Any, ...]]:
    reader = TxmqStoreReader(
        {"path": store, "view": "transactions", "splitbytes": str(split), "batchrows": str(batch_rows)}
    )
    names = [n for n, _t in TX_COLUMNS]
    rows: list[tuple[Any, ...]] = []
    for part in reader.partitions():
        for batch in reader.read(part):
            assert batch.schema.names == names
            assert batch.num_rows <= batch_rows + 2  # the last record may be a marker of up to 3 decisions
            rows.extend(tuple(r[n] for n in names) for r in batch.to_pylist())
    return rows


# -- records ---------------------------------------------------------------------------------------------------------


@st.composite
def tx_records(draw: st.DrawFn) -> MessageRecord:
    kind = draw(st.sampled_from(["half", "op", "ops", "rocketmq_op", "resume", "bad_op", "delivery", "discard",
                                 "plain", "other_tag"]))  # fmt: skip
    props: dict[str, str] = {}
    if draw(st.booleans()):
        props[Prop.UNIQ_KEY] = draw(NAME)
    if draw(st.booleans()):
        props[Prop.PGROUP] = draw(st.sampled_from(["PG_a", "PG_b", "Grüppe"]))
    if draw(st.booleans()):
        props[Prop.TRANSACTION_ID] = draw(NAME)
    if draw(st.integers(0, 3)) == 0:
        props[Prop.TX_ID] = draw(NAME)
        props[Prop.TX_SEQ] = draw(INT_TEXT)
    topic = "Orders"
    body = draw(st.binary(max_size=20))
    sys_flag = 0
    prepared = 0
    if kind in ("half", "discard"):
        topic = HALF_TOPIC if kind == "half" else DISCARD_TOPIC
        props[Prop.REAL_TOPIC] = draw(st.sampled_from(["Orders", "Zahlungen", "T%x"]))
        if draw(st.booleans()):
            props[Prop.REAL_QID] = draw(INT_TEXT)
        if kind == "discard" and draw(st.booleans()):
            props[Prop.TRANSACTION_CHECK_TIMES] = draw(INT_TEXT)
    elif kind in ("op", "ops", "rocketmq_op", "resume", "bad_op", "other_tag"):
        topic = OP_TOPIC
        n = draw(st.integers(2, 3)) if kind == "ops" else 1
        offsets = [draw(st.integers(0, 10**6)) for _ in range(n)]
        body = ",".join(map(str, offsets)).encode()
        if kind == "bad_op":
            body = draw(st.sampled_from([b"", b"x", b"1,,y", b" ", b"\xff"]))
        props[Prop.TAGS] = {"resume": RESUME_TAG, "other_tag": "z"}.get(kind, OP_TAG)
        if kind != "rocketmq_op":
            props[PROP_HALF_PHYS] = ",".join(
                str(draw(st.integers(0, 2**40))) for _ in range(draw(st.integers(n - 1, n)))
            )
            if draw(st.integers(0, 4)) == 0:
                props[PROP_HALF_PHYS] = draw(st.sampled_from(["x", "12a", ""]))
            props[PROP_DECISION] = ",".join(
                draw(st.sampled_from(["COMMIT", "ROLLBACK", "DISCARD", ""])) for _ in range(n)
            )
        if draw(st.booleans()):
            props[Prop.KEYS] = " ".join(draw(NAME) for _ in range(draw(st.integers(1, 3))))
    elif kind == "delivery":
        topic = draw(st.sampled_from(["Orders", "Zahlungen"]))
        sys_flag = 0x8
        prepared = draw(st.integers(0, 2**40))
        props[Prop.REAL_QID] = "1"  # left in a copy by an older broker: a delivery does not read it
    else:  # plain
        sys_flag = draw(st.sampled_from([0, 0x4, 0xC]))
    sys_flag |= draw(st.sampled_from([0, 0x10, 0x20, 0x30]))  # IPv6 born and/or store host
    return MessageRecord(
        topic=topic,
        body=body,
        queue_id=draw(st.integers(0, 7)),
        queue_offset=draw(st.integers(0, 10**9)),
        sys_flag=sys_flag,
        born_timestamp=draw(st.integers(-(2**40), 2**42)),
        born_host=V6 if sys_flag & 0x10 else V4,
        store_timestamp=draw(st.integers(0, 2**42)),
        store_host=draw(st.sampled_from([V6, ("10.0.0.8", 10912)])) if sys_flag & 0x20 else V4,
        prepared_transaction_offset=prepared,
        properties={k: v for k, v in props.items() if v},
    )


@st.composite
def segment_files(draw: st.DrawFn) -> bytes:
    out = bytearray()
    for rec in draw(st.lists(tx_records(), max_size=12)):
        rec.physical_offset = BASE + len(out)
        raw = encode_record(rec)
        damage = draw(st.sampled_from(["none"] * 8 + ["crc", "props_utf8", "topic_utf8"]))
        if damage == "crc":
            raw[8:12] = b"\x00\x00\x00\x01"
        elif damage == "props_utf8" and rec.properties:
            raw[-1] = 0xFF
        elif damage == "topic_utf8":
            raw[body_len_pos(rec.sys_flag) + 4 + len(rec.body) + 1] = 0xFF  # the topic's first byte
        out += raw
    tail = draw(st.sampled_from(["zeros", "blank", "garbage", "torn", "none"]))
    if tail == "zeros":
        out += bytes(draw(st.integers(0, 300)))
    elif tail == "blank":
        out += encode_blank(draw(st.integers(8, 200)))
    elif tail == "garbage":
        out += draw(st.binary(min_size=8, max_size=60))
    elif tail == "torn" and out:
        del out[draw(st.integers(0, len(out) - 1)) :]
    return bytes(out)


@given(segment_files(), st.booleans(), st.sampled_from([4096, 1 << 20]), st.sampled_from([1, 3, 65536]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_fast_scan_gives_the_record_decoders_rows(data: bytes, pad: bool, split: int, batch_rows: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "commitlog"))
        path = os.path.join(root, "commitlog", f"{BASE:020d}")
        # a segment file is preallocated: the data, then zeros up to its size (several ranges when split is small);
        # or the data alone (a torn record at the very end of the file)
        with open(path, "wb") as f:
            f.write(data + bytes(max(0, 3 * 4096 + 100 - len(data)) if pad else 0))
        assert commitlog_dir(root).endswith("commitlog")
        size = os.path.getsize(path)
        want = expected_rows(path, 0, size)
        assert reader_rows(root, split, batch_rows) == want


def test_ranges_split_mid_record_and_chunk_boundaries_lose_nothing(tmp_path: Any, monkeypatch: Any) -> None:
    """A store of many records in ranges of 4 KiB and pieces of 1 KiB (records cross both) gives every row once."""
    import txmq.spark.store_source as store_source

    monkeypatch.setattr(store_source, "CHUNK_BYTES", 1024)
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    out = bytearray()
    for i in range(400):
        half = MessageRecord(
            topic=HALF_TOPIC,
            body=b"x" * (i % 700),
            queue_offset=i,
            physical_offset=BASE + len(out),
            store_host=V4,
            properties={Prop.UNIQ_KEY: f"U{i}", Prop.PGROUP: "PG", Prop.REAL_TOPIC: "T", Prop.REAL_QID: str(i % 4)},
        )
        out += encode_record(half)
    path = commitlog / f"{BASE:020d}"
    path.write_bytes(bytes(out) + bytes(8192))
    want = expected_rows(str(path), 0, len(out) + 8192)
    assert len(want) == 400
    got = reader_rows(str(tmp_path), 4096, 7)
    assert got == want
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert len(mm) > 4096  # several ranges were read
