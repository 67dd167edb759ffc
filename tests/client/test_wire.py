"""txmq.client.wire: the per-message request builders equal the typed headers, the bytes on the wire are the ones the
client wrote before the module existed, and a send's answer reads into the same SendResult (or the same error)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from client_fakes import FakeBroker
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.client import LocalTransactionState, Message, MessageQueue, Producer, SendStatus, TransactionProducer, wire
from txmq.client.wire import (
    SendTemplate,
    end_transaction_ext,
    lenient_int,
    request_command,
    send_result,
    send_v2_ext,
)
from txmq.errors import MQBrokerError, MQClientError
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand, encode_frame
from txmq.protocol.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from txmq.protocol.record import Prop, SysFlag, encode_properties
from txmq.protocol.topics import AUTO_CREATE_TOPIC_KEY

MakeBroker = Callable[..., Awaitable[FakeBroker]]
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)

# Frames written by the client of main at 5012605 (before txmq.client.wire), opaque fixed: the same inputs must give
# the same bytes.
SEND_FRAME = bytes.fromhex(
    "0000012d000001247b22636f6465223a3331302c226c616e6775616765223a22505954484f4e222c2276657273696f6e223a3430392c22"
    "6f7061717565223a37372c22666c6167223a302c226578744669656c6473223a7b2261223a225047222c2262223a224f7264657273222c"
    "2263223a22544257313032222c2264223a2234222c2265223a2233222c2266223a2234222c2267223a2231373634303030303030313233"
    "222c2268223a2230222c226a223a2230222c226b223a2266616c7365222c226d223a2266616c7365222c2269223a22554e49515f4b4559"
    "5c753030303143304138303030315c75303030325452414e5f4d53475c7530303031747275655c7530303032227d2c2273657269616c69"
    "7a655479706543757272656e74525043223a224a534f4e227d68656c6c6f"
)
END_FRAME = bytes.fromhex(
    "0000011a000001167b22636f6465223a33372c226c616e6775616765223a22505954484f4e222c2276657273696f6e223a3430392c226f"
    "7061717565223a37382c22666c6167223a322c226578744669656c6473223a7b2270726f647563657247726f7570223a225047222c2274"
    "72616e53746174655461626c654f6666736574223a223132222c22636f6d6d69744c6f674f6666736574223a22333435222c22636f6d6d"
    "69744f72526f6c6c6261636b223a2238222c2266726f6d5472616e73616374696f6e436865636b223a2266616c7365222c226d73674964"
    "223a2243304138222c227472616e73616374696f6e4964223a2243304138227d2c2273657269616c697a655479706543757272656e7452"
    "5043223a224a534f4e227d"
)


def test_frames_are_the_bytes_the_client_always_wrote() -> None:
    props = "UNIQ_KEY\x01C0A80001\x02TRAN_MSG\x01true\x02"
    send = request_command(
        RequestCode.SEND_MESSAGE_V2,
        send_v2_ext("PG", "Orders", 4, 3, 4, 1764000000123, 0, props, 0, None, False),
        b"hello",
        False,
    )
    send.opaque = 77  # the connection numbers requests as it sends them
    assert encode_frame(send) == SEND_FRAME
    end = request_command(
        RequestCode.END_TRANSACTION, end_transaction_ext("PG", 12, 345, 8, False, "C0A8", "C0A8", None), b"", True
    )
    end.opaque = 78
    assert encode_frame(end) == END_FRAME


def test_the_default_topic_is_the_auto_create_template() -> None:
    assert send_v2_ext("G", "T", 4, 0, 0, 0, 0, None, 0, None, False)["c"] == AUTO_CREATE_TOPIC_KEY


@given(
    st.tuples(
        st.text("abcXYZ_-%|09", min_size=1, max_size=10),
        st.text("abcXYZ_-%|09", min_size=1, max_size=10),
        st.integers(0, 64),
        st.integers(-1, 255),
        st.integers(0, 2**31 - 1),
        INT64,
        st.integers(-(2**31), 2**31 - 1),
        st.none() | TEXT,
        st.integers(0, 16),
        st.none() | st.integers(-1, 64),
        st.booleans(),
    )
)
@settings(max_examples=200, deadline=None)
def test_send_ext_equals_the_typed_header(values: tuple[Any, ...]) -> None:
    group, topic, qnums, qid, sys_flag, born, flag, props, reconsume, max_reconsume, batch = values
    typed = SendMessageRequestHeader(
        producerGroup=group,
        topic=topic,
        defaultTopic="TBW102",
        defaultTopicQueueNums=qnums,
        queueId=qid,
        sysFlag=sys_flag,
        bornTimestamp=born,
        flag=flag,
        properties=props,
        reconsumeTimes=reconsume,
        unitMode=False,
        maxReconsumeTimes=max_reconsume,
        batch=batch,
    )
    ext = send_v2_ext(group, topic, qnums, qid, sys_flag, born, flag, props, reconsume, max_reconsume, batch)
    assert ext == typed.to_v2_ext()
    assert SendMessageRequestHeader.from_ext(ext) == typed


@given(
    st.tuples(TEXT, INT64, INT64, st.sampled_from([0, 8, 12]), st.booleans(), TEXT, st.none() | TEXT, st.none() | INT64)
)
@settings(max_examples=200, deadline=None)
def test_end_transaction_ext_equals_the_typed_header_key_for_key(values: tuple[Any, ...]) -> None:
    typed = EndTransactionRequestHeader(*values).to_ext()
    assert list(end_transaction_ext(*values).items()) == list(typed.items())  # same keys in the same order


def _response(code: int, ext: dict[str, str], remark: str | None = None) -> RemotingCommand:
    return RemotingCommand(code, 5, 1, remark, ext)


MQ = MessageQueue("T", "broker-a", 2)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (0, SendStatus.SEND_OK),
        (10, SendStatus.FLUSH_DISK_TIMEOUT),
        (11, SendStatus.SLAVE_NOT_AVAILABLE),
        (12, SendStatus.FLUSH_SLAVE_TIMEOUT),
    ],
)
def test_stored_answers_read_into_a_send_result(code: int, status: SendStatus) -> None:
    ext = {"msgId": "OFF", "queueId": "2", "queueOffset": "41", "transactionId": "TX", "MSG_REGION": "R"}
    r = send_result(_response(code, ext), MQ, "UNIQ", "127.0.0.1:1")
    assert (r.status, r.msg_id, r.offset_msg_id, r.message_queue, r.queue_offset) == (status, "UNIQ", "OFF", MQ, 41)
    assert (r.transaction_id, r.region_id, r.trace_on) == ("TX", "R", True)


def test_an_answer_names_the_queue_the_broker_stored_in_and_reads_numbers_leniently() -> None:
    r = send_result(_response(0, {"queueId": " 3 ", "queueOffset": "x", "TRACE_ON": "FALSE"}), MQ, "U", "a:1")
    assert r.message_queue == MessageQueue("T", "broker-a", 3)
    assert (r.offset_msg_id, r.queue_offset, r.trace_on, r.transaction_id, r.region_id) == ("", 0, False, None, None)
    r = send_result(_response(0, {"queueId": "1e3"}), MQ, "U", "a:1")
    assert r.message_queue is MQ
    assert [lenient_int(v, -1) for v in (None, "7", "-7", "+7", "1_0", "", "9" * 30)] == [
        -1,
        7,
        -7,
        7,
        10,
        -1,
        int("9" * 30),
    ]


@pytest.mark.parametrize("code", [1, 14, 17, 204, 13, 2])
def test_any_other_answer_is_the_brokers_error(code: int) -> None:
    with pytest.raises(MQBrokerError) as caught:
        send_result(_response(code, {"queueId": "1"}, "no way"), MQ, "U", "10.0.0.1:10911")
    assert (caught.value.code, caught.value.remark, caught.value.addr) == (code, "no way", "10.0.0.1:10911")
    assert "BROKER: 10.0.0.1:10911" in str(caught.value)


class _Commit:
    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


async def test_a_transaction_writes_its_half_and_end_as_the_typed_headers_say(
    namesrv: str, make_broker: MakeBroker
) -> None:
    broker = await make_broker("broker-a", {"T": (4, 4, 6)})
    broker.handlers[RequestCode.END_TRANSACTION] = lambda _c, _cmd: None
    async with TransactionProducer("TPG", namesrv, _Commit()) as producer:
        result = await producer.send_message_in_transaction(Message("T", b"x" * 5000))  # compressed too
        for _ in range(100):
            if broker.of_code(RequestCode.END_TRANSACTION):
                break
            await asyncio.sleep(0.01)
    (half,) = broker.of_code(RequestCode.SEND_MESSAGE_V2)
    h = SendMessageRequestHeader.from_ext(half.ext_fields)
    assert half.language == "PYTHON" and h.sysFlag == 4 | 1 and h.producerGroup == "TPG"  # prepared, compressed
    assert list(half.ext_fields) == [*"abcdefghjkm", "i"]  # the client's order since V2 sends began
    (end,) = broker.of_code(RequestCode.END_TRANSACTION)
    assert end.flag & 2 and end.language == "PYTHON"
    assert list(end.ext_fields.items()) == list(
        EndTransactionRequestHeader(
            producerGroup="TPG",
            tranStateTableOffset=result.queue_offset,
            commitLogOffset=int(result.offset_msg_id[16:], 16),
            commitOrRollback=8,
            fromTransactionCheck=False,
            msgId=result.msg_id,
            transactionId=result.msg_id,
        )
        .to_ext()
        .items()
    )


def test_the_module_constants_are_the_protocols() -> None:
    assert (wire._SEND_MESSAGE_V2, wire._SEND_REPLY_MESSAGE_V2) == (
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_REPLY_MESSAGE_V2,
    )
    assert (wire._COMPRESSED, wire._TRANSACTION_PREPARED) == (SysFlag.COMPRESSED, SysFlag.TRANSACTION_PREPARED)
    assert (Prop.TRAN_MSG, Prop.MSG_TYPE) == ("TRAN_MSG", "MSG_TYPE")


PROPS = st.dictionaries(
    st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "TRAN_MSG", "MSG_TYPE", "a", "b"]),
    st.sampled_from(["true", "false", "reply", "x", "", "k1 k2"]) | st.text(max_size=10),
    max_size=6,
)


@given(
    st.tuples(st.text("abcXYZ_-", min_size=1, max_size=8), st.text("abcXYZ_-", min_size=1, max_size=8)),
    st.integers(0, 64),
    st.integers(-1, 300),
    st.binary(min_size=1, max_size=300) | st.just(b"a" * 400),
    PROPS,
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 2**45),
    st.sampled_from([0, 10, 100, 4096]),
    st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_a_topics_template_gives_what_send_v2_ext_gives(
    names: tuple[str, str],
    qnums: int,
    qid: int,
    body: bytes,
    props: dict[str, str],
    flag: int,
    born: int,
    compress_over: int,
    oneway: bool,
) -> None:
    group, topic = names
    cmd = SendTemplate(group, topic, qnums).command(qid, body, props, flag, born, compress_over, 5, oneway)
    compressed = len(body) > compress_over and len(zlib.compress(body, 5)) < len(body)
    sys_flag = (1 if compressed else 0) | (4 if props.get("TRAN_MSG") == "true" else 0)
    ext = send_v2_ext(group, topic, qnums, qid, sys_flag, born, flag, encode_properties(props), 0, None, False)
    assert list(cmd.ext_fields.items()) == list(ext.items())
    assert cmd.body == (zlib.compress(body, 5) if compressed else body)
    assert cmd.code == (325 if props.get("MSG_TYPE") == "reply" else 310)
    assert (cmd.flag, cmd.language, cmd.serialize_type) == (2 if oneway else 0, "PYTHON", 0)


async def test_a_flag_that_is_not_a_number_is_refused_before_sending(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (4, 4, 6)})
    async with Producer("PG", namesrv) as producer:
        with pytest.raises(MQClientError, match="flag must be an int"):
            await producer.send(Message("T", b"x", flag="3"))  # type: ignore[arg-type]
        result = await producer.send(Message("T", b"x", flag=True))  # a bool is the number 1, as Java's int
    assert result.status is SendStatus.SEND_OK
    (cmd,) = broker.of_code(RequestCode.SEND_MESSAGE_V2)
    assert cmd.ext_fields["h"] == "1"


async def test_changing_the_producers_settings_changes_what_it_sends(namesrv: str, make_broker: MakeBroker) -> None:
    broker = await make_broker("broker-a", {"T": (4, 4, 6)})
    async with Producer("PG", namesrv) as producer:
        await producer.send(Message("T", b"x"))
        producer.default_topic_queue_nums = 8
        await producer.send(Message("T", b"x"))
    first, second = broker.of_code(RequestCode.SEND_MESSAGE_V2)
    assert (first.ext_fields["d"], second.ext_fields["d"]) == ("4", "8")
