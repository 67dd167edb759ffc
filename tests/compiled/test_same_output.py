"""The compiled hot path gives the bytes and the errors its interpreted source gives, for any input (Hypothesis).

Each example runs one ``hotpath_ops`` operation here (compiled) and in a child process on the ``.py`` sources
(``TXMQ_PURE_PYTHON=1``), and compares the two answers: frames and records byte for byte, decoded fields value for
value, and a refusal as the same exception class with the same message. Inputs are valid values, and valid
encodings with bytes flipped, cut off, or appended, and plain noise.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest
from hotpath_ops import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.protocol import headers
from txmq.protocol.frame import LANGUAGE_NAMES, RemotingCommand, encode_frame
from txmq.protocol.record import BatchEntry, MessageRecord, encode_batch, encode_record

pytestmark = pytest.mark.usefixtures("interpreted")

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
WIDE = INT64 | st.integers(-(2**70), 2**70)  # past a field's width too: both builds must refuse alike
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
NAME = st.text("abcXYZ_%-|09", min_size=1, max_size=12)


def same(interpreted: Any, name: str, *args: Any) -> Any:
    compiled = run(name, args)
    assert interpreted.call(name, *args) == compiled
    return compiled


# -- mutations of valid bytes ---------------------------------------------------------------------------------------


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` as it is, with a few bytes changed, cut short, with bytes after it, or several of these."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "append", "set"]))
        if kind == "flip" and out:
            at = draw(st.integers(0, len(out) - 1))
            out[at] ^= draw(st.integers(1, 255))
        elif kind == "cut" and out:
            del out[draw(st.integers(0, len(out) - 1)) :]
        elif kind == "append":
            out += draw(st.binary(max_size=40))
        elif kind == "set" and len(out) >= 4:
            at = draw(st.integers(0, len(out) - 4))
            out[at : at + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\0\0\0\0"]))
    return bytes(out)


# -- frames ---------------------------------------------------------------------------------------------------------

# ext_fields values of any type a caller passes; the encoder writes them as Java would print them.
EXT_VALUE = (
    TEXT
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(1e-4, 1e8)  # around Java's switch between plain and E notation
    | st.booleans()
    | st.none()
    | st.decimals(allow_nan=False, places=3)
)


@st.composite
def commands(draw: st.DrawFn, valid: bool = True) -> dict[str, Any]:
    binary = draw(st.booleans())
    fields = {
        "code": draw(INT16 if binary and valid else INT32),
        "opaque": draw(INT32),
        "flag": draw(INT32),
        "remark": draw(st.none() | TEXT),
        "ext_fields": draw(st.dictionaries(TEXT, TEXT if valid else EXT_VALUE, max_size=6)),
        "body": draw(st.binary(max_size=200)),
        "language": draw(st.sampled_from(LANGUAGE_NAMES) if valid else st.sampled_from(LANGUAGE_NAMES) | NAME),
        "version": draw(INT16 if binary and valid else INT32),
        "serialize_type": 1 if binary else 0,
    }
    if not valid:
        fields["code"] = draw(st.just(fields["code"]) | WIDE)
    return fields


@given(commands(valid=False))
@SETTINGS
def test_any_command_encodes_to_the_same_frame(interpreted: Any, fields: dict[str, Any]) -> None:
    same(interpreted, "encode_frame", fields)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], int]:
    frames = [encode_frame(RemotingCommand(**f)) for f in draw(st.lists(commands(), max_size=4))]
    stream = draw(damaged(b"".join(frames))) if draw(st.booleans()) else b"".join(frames)
    if draw(st.integers(0, 9)) == 0:
        stream = draw(st.binary(max_size=64))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    max_frame_size = draw(st.sampled_from([16 * 1024 * 1024, 256, 64, 8]))
    return chunks, max_frame_size


@given(streams())
@SETTINGS
def test_any_stream_decodes_to_the_same_commands_or_the_same_error(interpreted: Any, stream: Any) -> None:
    chunks, max_frame_size = stream
    same(interpreted, "feed", chunks, max_frame_size)
    same(interpreted, "decode_frame", b"".join(chunks), max_frame_size)


def test_every_language_and_both_header_types_round_trip_alike(interpreted: Any) -> None:
    for serialize_type in (0, 1):
        for language in LANGUAGE_NAMES:
            fields = {"code": 310, "opaque": 7, "language": language, "serialize_type": serialize_type}
            frame = same(interpreted, "encode_frame", fields)[1][0]
            assert same(interpreted, "decode_frame", frame, 1 << 24)[1][6] == language


def test_java_forms_of_awkward_numbers_are_the_same(interpreted: Any) -> None:
    values = [0.1, 1e21, 1e-7, -0.0, math.inf, -math.inf, math.nan, 2**63, -(2**63) - 1, True, None, Decimal("1.50")]
    values += [0.001, 0.00099, 1234567.0, 9999999.0, 1e7, 12345678.9, -5e-324, 1.7976931348623157e308]
    ext = {f"k{i}": v for i, v in enumerate(values)}
    same(interpreted, "encode_frame", {"code": 1, "ext_fields": ext})


# -- records --------------------------------------------------------------------------------------------------------

IPV4 = st.ip_addresses(v=4).map(str)
IPV6 = st.ip_addresses(v=6).map(str)
HOST = st.tuples(IPV4 | IPV6, st.integers(0, 65535))
ODD_HOST = HOST | st.tuples(NAME, st.integers(-5, 70000))
PROP = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=12)
SYSTEM_PROPS = st.fixed_dictionaries(
    {},
    optional={
        "TAGS": NAME,
        "KEYS": st.lists(NAME, max_size=3).map(" ".join),
        "UNIQ_KEY": NAME,
        "DELAY": st.integers(-1, 20).map(str) | NAME,
    },
)


@st.composite
def record_fields(draw: st.DrawFn, valid: bool = True) -> dict[str, Any]:
    number = INT64 if valid else WIDE
    fields = {
        "topic": draw(
            st.sampled_from(["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"]) | st.text("abcXYZ%_-|09", min_size=1)
        ),
        "body": draw(st.binary(max_size=300)),
        "queue_id": draw(INT32 if valid else WIDE),
        "flag": draw(INT32),
        "queue_offset": draw(number),
        "physical_offset": draw(INT64),
        "sys_flag": draw(st.integers(0, 0xF) | st.sampled_from([0x100, 0x301, 0x4, 0x8, 0xC, 0x10, 0x80])),
        "born_timestamp": draw(INT64),
        "born_host": draw(HOST if valid else ODD_HOST),
        "store_timestamp": draw(INT64),
        "store_host": draw(HOST),
        "reconsume_times": draw(INT32),
        "prepared_transaction_offset": draw(number),
        "properties": {**draw(st.dictionaries(PROP, PROP, max_size=5)), **draw(SYSTEM_PROPS)},
        "body_crc": draw(st.none() | st.integers(0, 2**31 - 1)),
    }
    if not valid:
        fields["topic"] = draw(st.just(fields["topic"]) | TEXT | st.text("ab", min_size=120, max_size=140))
        if draw(st.booleans()):
            fields["properties"] = draw(st.dictionaries(TEXT, TEXT, max_size=4))
    return fields


@given(record_fields(valid=False), st.none() | TEXT, st.none() | st.integers(0, 400))
@SETTINGS
def test_any_record_encodes_to_the_same_bytes_or_the_same_refusal(
    interpreted: Any, fields: dict[str, Any], properties_text: str | None, max_body: int | None
) -> None:
    same(interpreted, "encode_record", fields, properties_text, max_body)
    same(interpreted, "encode_entry", fields, 200 if max_body is None else max_body, [1000, 5000, 10000])


@st.composite
def record_bytes(draw: st.DrawFn) -> tuple[bytes, int]:
    prefix = draw(st.binary(max_size=8))
    data = prefix + bytes(encode_record(MessageRecord(**draw(record_fields()))))
    if draw(st.booleans()):
        data = draw(damaged(data))
    return data, len(prefix)


@given(record_bytes(), st.booleans())
@SETTINGS
def test_any_record_bytes_decode_to_the_same_fields_or_the_same_error(
    interpreted: Any, record: tuple[bytes, int], check_crc: bool
) -> None:
    data, offset = record
    same(interpreted, "decode_record", data, offset, check_crc)
    same(interpreted, "view", data, offset, check_crc)
    same(interpreted, "entry_from_bytes", data[offset:], 250, [1000, 5000])


@st.composite
def segments(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    base = draw(st.sampled_from([0, 1 << 30]))
    out = bytearray()
    for fields in draw(st.lists(record_fields(), max_size=4)):
        fields["physical_offset"] = base + len(out)
        out += encode_record(MessageRecord(**fields))
    data = draw(damaged(bytes(out))) if draw(st.booleans()) else bytes(out) + bytes(draw(st.integers(0, 40)))
    options = draw(
        st.fixed_dictionaries(
            {"base": st.just(base)},
            optional={
                "check_crc": st.booleans(),
                "check_physical_offset": st.booleans(),
                "skip_bad_crc": st.booleans(),
                "views": st.booleans(),
                "tail_room": st.sampled_from([0, 8]),
                "yield_from": st.integers(0, len(data)).map(lambda n: base + n),
                "stop_at": st.integers(0, len(data) + 10).map(lambda n: base + n),
                "limit": st.integers(0, len(data)),
            },
        )
    )
    return data, options


@given(segments())
@SETTINGS
def test_any_segment_walks_to_the_same_records_and_the_same_stop(interpreted: Any, segment: Any) -> None:
    data, options = segment
    same(interpreted, "walk", data, options)


TX_TOPICS = ["RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "Orders"]
TX_PROPS = st.dictionaries(
    st.sampled_from(
        [
            "UNIQ_KEY",
            "PGROUP",
            "REAL_TOPIC",
            "REAL_QID",
            "__transactionId__",
            "TXMQ_TX_ID",
            "TXMQ_TX_SEQ",
            "TRANSACTION_CHECK_TIMES",
            "TAGS",
            "KEYS",
            "TXMQ_HALF_PHYS",
            "TXMQ_DECISION",
        ]
    ),
    st.sampled_from(["d", "txmq_resume", "COMMIT", "1,2", "12", "x", "a b", "-3", "2147483648"]) | NAME,
    max_size=6,
)


@st.composite
def tx_segments(draw: st.DrawFn) -> tuple[bytes, int]:
    """Segments of transaction records (any topic, sysFlag, properties and body), damaged or not."""
    base = draw(st.sampled_from([0, 1 << 30]))
    out = bytearray()
    for fields in draw(st.lists(record_fields(), max_size=5)):
        fields["physical_offset"] = base + len(out)
        fields["topic"] = draw(st.sampled_from(TX_TOPICS))
        fields["properties"] = draw(TX_PROPS)
        fields["body"] = draw(st.sampled_from([b"5", b"1,2", b"x", b""]) | st.binary(max_size=10))
        out += encode_record(MessageRecord(**fields))
    data = draw(damaged(bytes(out))) if draw(st.booleans()) else bytes(out) + bytes(draw(st.integers(0, 40)))
    return data, base


@given(tx_segments(), st.data())
@SETTINGS
def test_any_segment_gives_the_same_transaction_columns(interpreted: Any, segment: Any, data: st.DataObject) -> None:
    raw, base = segment
    pos = data.draw(st.integers(0, len(raw)))
    stop = data.draw(st.integers(0, len(raw) + 10))
    chunk = data.draw(st.sampled_from([8, 100, 1 << 20]))
    same(interpreted, "tx_columns", raw, base, 0, stop, chunk, data.draw(st.sampled_from([1, 2, 1000])))
    same(interpreted, "tx_columns", raw, base, pos, stop, chunk, 1000)
    same(interpreted, "record_starts", raw, data.draw(st.lists(st.integers(0, len(raw) + 10), max_size=4)), 0)


@given(st.text(max_size=60) | st.lists(PROP | st.sampled_from(["\x01", "\x02"]), max_size=12).map("".join), TEXT, TEXT)
@SETTINGS
def test_any_properties_text_decodes_alike(interpreted: Any, text: str, key: str, other: str) -> None:
    same(interpreted, "properties", text, key, other)
    same(interpreted, "encode_properties", {key: text, other: key})


@given(st.lists(st.tuples(st.binary(max_size=50), INT32, st.text(max_size=20)), max_size=4), st.data())
@SETTINGS
def test_any_batch_body_splits_alike(interpreted: Any, entries: list[Any], data: st.DataObject) -> None:
    same(interpreted, "batch", entries)
    body = encode_batch([BatchEntry(b, f, p) for b, f, p in entries])
    same(interpreted, "decode_batch", data.draw(damaged(body)))


@given(st.text("0123456789ABCDEFabcdefx", min_size=30, max_size=58) | TEXT, st.none() | NAME | TEXT)
@SETTINGS
def test_any_message_id_and_tag_alike(interpreted: Any, msg_id: str, tags: str | None) -> None:
    same(interpreted, "msg_id", msg_id)
    same(interpreted, "tags_code", tags)


# -- topics -------------------------------------------------------------------------------------------------------


@given(NAME | TEXT | st.text("abc%|-_", min_size=120, max_size=135) | st.just(""), INT32, INT32, st.integers(0, 15))
@SETTINGS
def test_any_topic_is_checked_alike(interpreted: Any, name: str, read: int, write: int, perm: int) -> None:
    same(interpreted, "topic", name, read, write, perm)
    same(interpreted, "topic", "%RETRY%" + name, read, write, perm)


# -- request headers (protocol.headers: explicit parsers for the hot requests, the generic loop for the rest) ------

# A value of each kind a header field may be sent: Java numbers (and what Long.parseLong refuses), booleans, text.
HEADER_VALUE = (
    INT64.map(str)
    | WIDE.map(str)
    | st.sampled_from(["true", "TRUE", "false", "1", "0", " 7 ", "+3", "-0", "1_000", "\u0661", "", "0x10", "1e3", "-"])
    | TEXT
)
HEADERS = {  # header class: its request code
    "SendMessageRequestHeader": 310,
    "EndTransactionRequestHeader": 37,
    "PullMessageRequestHeader": 11,
    "QueueHeader": 30,
    "ConsumerSendMsgBackRequestHeader": 36,
}


@st.composite
def header_exts(draw: st.DrawFn) -> tuple[str, dict[str, str], int]:
    name = draw(st.sampled_from(sorted(HEADERS)))
    code = HEADERS[name]
    keys = [wire for _name, wire, *_ in headers.spec_of(getattr(headers, name))]  # the generic parser's names
    if name == "SendMessageRequestHeader" and draw(st.booleans()):
        keys = list(headers.SEND_V2_KEYS)
    elif name == "SendMessageRequestHeader":
        code = 10
    present = draw(st.lists(st.sampled_from(keys), unique=True, min_size=len(keys) - 2, max_size=len(keys)))
    ext = {k: draw(HEADER_VALUE) for k in present}
    ext.update(draw(st.dictionaries(TEXT, TEXT, max_size=2)))  # fields no header reads
    return name, ext, code


@given(header_exts())
@SETTINGS
def test_any_request_header_parses_and_writes_alike(interpreted: Any, header: tuple[str, dict[str, str], int]) -> None:
    same(interpreted, "header", *header)


# -- the client's per-message requests and answers (txmq.client.wire) ------------------------------------------------

SEND_ARGS = st.tuples(
    TEXT,
    TEXT,
    INT32,
    INT32,
    INT32,
    WIDE,
    INT32,
    st.none() | TEXT,
    INT32,
    st.none() | INT32,
    st.booleans(),
)
END_ARGS = st.tuples(
    TEXT, WIDE, WIDE, st.sampled_from([0, 8, 12]) | INT32, st.booleans(), TEXT, st.none() | TEXT, st.none() | WIDE
)


@given(SEND_ARGS, st.binary(max_size=100), st.booleans(), INT32)
@SETTINGS
def test_any_send_request_is_the_same_frame(
    interpreted: Any, send: Any, body: bytes, oneway: bool, opaque: int
) -> None:
    same(interpreted, "send_request", send, body, oneway, opaque)


@given(END_ARGS, st.booleans(), INT32)
@SETTINGS
def test_any_end_transaction_request_is_the_same_frame(interpreted: Any, end: Any, oneway: bool, opaque: int) -> None:
    same(interpreted, "end_request", end, oneway, opaque)


ANSWER_VALUE = TEXT | INT64.map(str) | st.sampled_from(["", " 7 ", "+3", "1_0", "0x10", "true", "FALSE", "1e3"])


@st.composite
def send_answers(draw: st.DrawFn) -> bytes:
    keys = st.sampled_from(["msgId", "queueId", "queueOffset", "transactionId", "MSG_REGION", "TRACE_ON"]) | TEXT
    fields = {
        "code": draw(st.sampled_from([0, 10, 11, 12, 1, 14, 17, 204]) | INT16),
        "opaque": draw(INT32),
        "flag": 1,
        "remark": draw(st.none() | TEXT),
        "ext_fields": draw(st.dictionaries(keys, ANSWER_VALUE, max_size=7)),
        "language": "JAVA",
        "serialize_type": draw(st.sampled_from([0, 1])),
    }
    return encode_frame(RemotingCommand(**fields))


@given(send_answers(), st.tuples(NAME, NAME, INT32), TEXT, TEXT)
@SETTINGS
def test_any_send_answer_reads_alike(interpreted: Any, frame: bytes, mq: Any, uniq_key: str, addr: str) -> None:
    same(interpreted, "send_result", frame, mq, uniq_key, addr)


@given(st.none() | ANSWER_VALUE, INT64)
@SETTINGS
def test_any_answer_number_reads_alike(interpreted: Any, raw: str | None, default: int) -> None:
    same(interpreted, "lenient_int", raw, default)


@given(
    st.tuples(TEXT, TEXT, INT32),
    st.tuples(INT32, st.binary(max_size=300), st.dictionaries(TEXT, TEXT, max_size=5), INT32, WIDE),
    st.tuples(st.sampled_from([0, 50, 4096]) | INT32, st.integers(-1, 9)),
    st.booleans(),
)
@SETTINGS
def test_any_plain_send_from_a_template_is_the_same_frame(
    interpreted: Any, head: Any, message: Any, compress: Any, oneway: bool
) -> None:
    same(interpreted, "send_template", head, message, compress, oneway)


KEY_RECORDS = st.lists(
    st.tuples(
        st.sampled_from(["T", "Orders", "主题"]),
        st.integers(0, 1 << 40),
        st.integers(1, 5000),
        st.integers(0, 1 << 42),
        st.sampled_from([0, 4, 8, 12]),  # 12: a rollback record, never indexed
        st.one_of(st.none(), st.text(alphabet=" ab键1", max_size=12)),
        st.one_of(st.none(), st.text(alphabet="0123456789ABCDEF", max_size=32)),
    ),
    max_size=20,
)


@given(KEY_RECORDS, st.integers(0, 1 << 40), st.integers(1, 64))
@SETTINGS
def test_any_records_give_the_same_key_index_entries(
    interpreted: Any, records: list[Any], progress: int, slots: int
) -> None:
    same(interpreted, "key_entries", records, progress, slots)


CQ_RECORDS = st.lists(
    st.tuples(
        st.sampled_from(["T", "Orders"]),
        st.integers(0, 3),
        st.integers(0, 6),  # queue offsets: in sequence, repeated or with gaps
        st.integers(0, 1 << 40),
        st.integers(1, 5000),
        st.integers(-(1 << 40), 1 << 40),
        st.sampled_from([0, 4, 8, 12]),  # prepared (4) and rollback (12) records have no entry
    ),
    max_size=24,
)


@given(CQ_RECORDS, st.dictionaries(st.sampled_from(["T", "Orders"]), st.integers(0, 3)))
@SETTINGS
def test_any_records_plan_the_same_consume_queue_entries(
    interpreted: Any, records: list[Any], maxes: dict[str, int]
) -> None:
    same(interpreted, "plan_puts", records, maxes)
