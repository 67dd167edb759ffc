"""The client's per-message requests and answers: SEND_MESSAGE_V2's and END_TRANSACTION's extFields, the request
commands, and the send response read into a :class:`SendResult`.

Every send and every transaction of :class:`~txmq.client.producer.Producer` runs through here, so this module is
compiled with mypyc (``setup.py`` HOT_MODULES, docs/compiled.md); the same code runs interpreted without a compiler or
with ``TXMQ_PURE_PYTHON=1``. It builds plain dicts and commands and reads them; it does no IO. The frames themselves
are encoded and decoded by :mod:`txmq.protocol.frame` (compiled too), so the bytes on the wire are the ones
:class:`~txmq.protocol.headers.SendMessageRequestHeader` / :class:`~txmq.protocol.headers.EndTransactionRequestHeader`
would give (unit tests keep the builders equal to the typed headers).
"""

from __future__ import annotations

from typing import Final

from txmq.client.message import SEND_STATUS_BY_CODE, MessageQueue, SendResult, compress_body
from txmq.errors import MQBrokerError
from txmq.protocol.frame import DEFAULT_VERSION, RemotingCommand
from txmq.protocol.record.properties import encode_properties

_DEFAULT_TOPIC: Final = "TBW102"  # protocol.topics.AUTO_CREATE_TOPIC_KEY (a test checks they agree)
_JSON: Final = 0
_PYTHON: Final = "PYTHON"
_SEND_MESSAGE_V2: Final = 310  # RequestCode.SEND_MESSAGE_V2, SEND_REPLY_MESSAGE_V2 (a test checks them)
_SEND_REPLY_MESSAGE_V2: Final = 325
_COMPRESSED: Final = 0x1  # SysFlag.COMPRESSED, TRANSACTION_PREPARED
_TRANSACTION_PREPARED: Final = 0x4
_SMALL: Final = [str(i) for i in range(256)]  # queue ids, sysFlags and flags as text, made once


def send_v2_ext(
    group: str,
    topic: str,
    default_topic_queue_nums: int,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    flag: int,
    properties: str | None,
    reconsume_times: int,
    max_reconsume_times: int | None,
    batch: bool,
) -> dict[str, str]:
    """SendMessageRequestHeaderV2's extFields (one-letter names), built directly: this runs once per message, and
    going through the typed header costs more than the rest of the send. Equal to
    ``SendMessageRequestHeader(...).to_v2_ext()`` for the same values (unit tests keep them in step); the keys come in
    the order this client has always written them (``i`` and ``l`` last)."""
    ext = {
        "a": group,
        "b": topic,
        "c": _DEFAULT_TOPIC,
        "d": str(default_topic_queue_nums),
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(born_timestamp),
        "h": str(flag),
        "j": str(reconsume_times),
        "k": "false",
        "m": "true" if batch else "false",
    }
    if properties is not None:
        ext["i"] = properties
    if max_reconsume_times is not None:
        ext["l"] = str(max_reconsume_times)
    return ext


def end_transaction_ext(
    group: str,
    tran_state_table_offset: int,
    commit_log_offset: int,
    commit_or_rollback: int,
    from_transaction_check: bool,
    msg_id: str,
    transaction_id: str | None,
    messages: int | None,
) -> dict[str, str]:
    """END_TRANSACTION's extFields, built directly (one per transaction): equal to
    ``EndTransactionRequestHeader(...).to_ext()`` for the same values, key order included (a unit test keeps them in
    step)."""
    ext = {
        "producerGroup": group,
        "tranStateTableOffset": str(tran_state_table_offset),
        "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(commit_or_rollback),
        "fromTransactionCheck": "true" if from_transaction_check else "false",
        "msgId": msg_id,
    }
    if transaction_id is not None:
        ext["transactionId"] = transaction_id
    if messages is not None:
        ext["txmqMessages"] = str(messages)
    return ext


def request_command(code: int, ext: dict[str, str], body: bytes, oneway: bool) -> RemotingCommand:
    """A request from this client (language PYTHON, JSON header). Its opaque is left at 0: the connection gives every
    request a fresh one as it sends it (``Connection.request`` / ``send_oneway``), and the client sends nothing
    any other way."""
    return RemotingCommand(code, 0, 2 if oneway else 0, None, ext, body, _PYTHON, DEFAULT_VERSION, _JSON)


def lenient_int(raw: str | None, default: int) -> int:
    """A response field as Python's ``int()`` reads it, ``default`` when absent or unreadable (what the client always
    did with a broker's answer: a bad offset in a stored message's answer is not worth failing the send)."""
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


def send_result(resp: RemotingCommand, mq: MessageQueue, uniq_key: str, addr: str) -> SendResult:
    """The broker's answer to a send as a :class:`SendResult` (codes 0, 10, 11, 12: stored), or
    :class:`~txmq.errors.MQBrokerError` with its code and remark for any other code."""
    code = resp.code
    status = SEND_STATUS_BY_CODE.get(code)
    if status is None:
        raise MQBrokerError(code, resp.remark, addr)
    ext = resp.ext_fields
    queue_id = lenient_int(ext.get("queueId"), mq.queue_id)
    if queue_id != mq.queue_id:
        mq = MessageQueue(mq.topic, mq.broker_name, queue_id)
    trace_on = ext.get("TRACE_ON")
    return SendResult(
        status,
        uniq_key,
        ext.get("msgId", ""),
        mq,
        lenient_int(ext.get("queueOffset"), 0),
        ext.get("transactionId"),
        ext.get("MSG_REGION"),
        trace_on is None or trace_on.lower() != "false",
    )


def _text(value: int) -> str:
    return _SMALL[value] if 0 <= value < 256 else str(value)


class SendTemplate:
    """What every plain send of one producer to one topic shares: the extFields that never change (group, topic,
    template topic and its queue count, no reconsume, not a batch), made once and copied per message with the four
    that do (queue id, sysFlag, born timestamp, flag) and the properties. Gives the same extFields as
    :func:`send_v2_ext`, key order included (a test checks)."""

    def __init__(self, group: str, topic: str, default_topic_queue_nums: int) -> None:
        self.topic = topic
        self.base: dict[str, str] = send_v2_ext(
            group, topic, default_topic_queue_nums, 0, 0, 0, 0, None, 0, None, False
        )

    def command(
        self,
        queue_id: int,
        body: bytes,
        properties: dict[str, str],
        flag: int,
        born_timestamp: int,
        compress_over: int,
        compress_level: int,
        oneway: bool,
    ) -> RemotingCommand:
        """SEND_MESSAGE_V2 of a message (SEND_REPLY_MESSAGE_V2 for a reply): the body zlib-compressed when it is
        larger than ``compress_over`` bytes and compressing makes it smaller; sysFlag PREPARED for a half message."""
        sys_flag = 0
        if len(body) > compress_over:
            packed = compress_body(body, compress_level)
            if len(packed) < len(body):
                body = packed
                sys_flag = _COMPRESSED
        if properties.get("TRAN_MSG") == "true":
            # A half message: brokers route it to the transaction half topic (Java sets this bit the same way).
            sys_flag |= _TRANSACTION_PREPARED
        ext = self.base.copy()
        ext["e"] = _text(queue_id)
        ext["f"] = _text(sys_flag)
        ext["g"] = str(born_timestamp)
        ext["h"] = _text(flag)
        ext["i"] = encode_properties(properties)
        code = _SEND_REPLY_MESSAGE_V2 if properties.get("MSG_TYPE") == "reply" else _SEND_MESSAGE_V2
        return RemotingCommand(code, 0, 2 if oneway else 0, None, ext, body, _PYTHON, DEFAULT_VERSION, _JSON)
