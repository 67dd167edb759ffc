"""The records a transaction writes or sends, built from its half message: the half message itself, the committed
copy, the copy a discard leaves in ``TRANS_CHECK_MAX_TIME_TOPIC``, the check a producer is asked, and op markers.
No IO: the driver stores and sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from txmq.protocol.op_marker import OP_TAG, PROP_HALF_PHYS, marker_fields
from txmq.protocol.record import (
    TRANSACTION_MASK,
    MessageRecord,
    Prop,
    TransactionType,
    body_crc,
    encode_offset_msg_id,
    with_transaction_type,
)
from txmq.protocol.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

Host = tuple[str, int]
_COMMIT_TYPE = int(TransactionType.COMMIT)


def make_half(record: MessageRecord) -> MessageRecord:
    """``record`` (a prepare) turned into its half message, in place: stored in the half topic's queue 0 with its
    destination in REAL_TOPIC / REAL_QID and the transaction bits of sysFlag cleared. Its body CRC is kept on it:
    the half message's encoding and its committed copy's then share one computation."""
    props = record.properties
    props[Prop.REAL_TOPIC] = record.topic
    props[Prop.REAL_QID] = str(record.queue_id)
    record.topic = TRANS_HALF_TOPIC
    record.queue_id = 0
    record.sys_flag &= ~TRANSACTION_MASK  # TransactionType.NOT_TYPE
    if record.body_crc is None:
        record.body_crc = body_crc(record.body)
    return record


def commit_copy(half: MessageRecord, store_host: Host) -> MessageRecord:
    """The message a COMMIT delivers: the half message in its real topic and queue, sysFlag COMMIT, PREPARED TX
    OFFSET = the half commit-log offset, REAL_TOPIC / REAL_QID / TRAN_MSG removed. Raises KeyError or ValueError
    when the half message lacks its destination."""
    props = half.properties.copy()
    pop = props.pop
    topic = pop(Prop.REAL_TOPIC)
    queue_id = int(pop(Prop.REAL_QID))
    pop(Prop.TRAN_MSG, None)
    return MessageRecord(  # positional (once per commit): topic, body, queue id, flag, queue offset, phys, ...
        topic,
        half.body,
        queue_id,
        half.flag,
        0,
        0,
        (half.sys_flag & ~TRANSACTION_MASK) | _COMMIT_TYPE,
        half.born_timestamp,
        half.born_host,
        0,  # store timestamp: the writer's
        store_host,
        half.reconsume_times,
        half.physical_offset,  # PREPARED TX OFFSET
        props,
        half.body_crc,
    )


def discard_copy(half: MessageRecord, checks: int, store_host: Host) -> MessageRecord:
    """What a discard keeps of the half message: a copy in TRANS_CHECK_MAX_TIME_TOPIC, properties kept."""
    return MessageRecord(
        topic=TRANS_CHECK_MAX_TIME_TOPIC,
        body=half.body,
        queue_id=0,
        flag=half.flag,
        sys_flag=with_transaction_type(half.sys_flag, TransactionType.NOT_TYPE),
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_host=store_host,
        reconsume_times=half.reconsume_times,
        properties={**half.properties, Prop.TRANSACTION_CHECK_TIMES: str(checks)},
    )


@dataclass(slots=True)
class CheckRequest:
    """What a producer is asked about one half message, whichever door carries it: the message as the producer
    sent it (real topic and queue, TRANSACTION_CHECK_TIMES = this check's number) and its ids."""

    message: MessageRecord
    group: str
    half_phys: int  # commitLogOffset
    half_queue_offset: int  # tranStateTableOffset
    msg_id: str  # the UNIQ_KEY, or the offsetMsgId when there is none
    transaction_id: str
    offset_msg_id: str


def check_request(half: MessageRecord, group: str, number: int, messages: int = 1) -> CheckRequest:
    """The ``number``-th check of the half message ``half`` of producer group ``group``; ``messages``: how many
    the transaction holds (said in TXMQ_TX_MESSAGES when several)."""
    props = half.properties
    if messages > 1:
        props = {**props, Prop.TX_MESSAGES: str(messages)}
    message = MessageRecord(
        topic=props[Prop.REAL_TOPIC],
        body=half.body,
        queue_id=int(props[Prop.REAL_QID]),
        flag=half.flag,
        queue_offset=half.queue_offset,
        physical_offset=half.physical_offset,
        sys_flag=half.sys_flag,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_timestamp=half.store_timestamp,
        store_host=half.store_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.prepared_transaction_offset,
        properties={**props, Prop.TRANSACTION_CHECK_TIMES: str(number)},
    )
    offset_msg_id = encode_offset_msg_id(half.store_host, half.physical_offset)
    msg_id = props.get(Prop.UNIQ_KEY) or offset_msg_id
    return CheckRequest(message, group, half.physical_offset, half.queue_offset, msg_id, msg_id, offset_msg_id)


def op_marker(body: bytes, props: dict[str, str], now_ms: int, store_host: Host, tag: str = OP_TAG) -> MessageRecord:
    """An op-topic record. No UNIQ_KEY of its own, as in RocketMQ: nobody looks a marker up by it, and the key index
    need not hold it."""
    return MessageRecord(
        topic=TRANS_OP_HALF_TOPIC,
        body=body,
        queue_id=0,
        born_timestamp=now_ms,
        born_host=store_host,
        store_host=store_host,
        properties={Prop.TAGS: tag, **props},
    )


MarkerItem = tuple[int, int, str, str, "str | None", "str | None"]


def decision_marker(items: Sequence[MarkerItem], now_ms: int, store_host: Host) -> MessageRecord:
    """One op marker (tag ``d``) holding ``(half queue offset, half phys, decision, by, copy msg id, uniq key)``
    items (:func:`txmq.protocol.op_marker.marker_fields`)."""
    body, props = marker_fields(items)
    return op_marker(body, props, now_ms, store_host)


def note_marker(
    half_phys: int,
    half_queue_offset: int,
    uniq_key: str | None,
    tag: str,
    extra: dict[str, str],
    now_ms: int,
    store_host: Host,
) -> MessageRecord:
    """An op-topic record about one half message that is not a decision (an operator's resume); ``KEYS`` = its
    UNIQ_KEY, so the key index finds a transaction's op records."""
    props = {PROP_HALF_PHYS: str(half_phys), **extra}
    if uniq_key:
        props[Prop.KEYS] = uniq_key
    return op_marker(str(half_queue_offset).encode("ascii"), props, now_ms, store_host, tag)
