"""What the transaction table asks its driver to do, as data: the table decides, the driver carries these out.

* :class:`Reply`: answer the request now with (code, remark); nothing is stored. ``warning`` is a line for the log.
* :class:`StoreDecision`: store the decision, a COMMIT's copy first and then the op marker, and tell the table once
  stored (:meth:`~txmq.txn.table.TransactionTable.applied`). A ROLLBACK is already applied in memory when the table
  returns it: the marker only records it. A transaction of several messages gives a list of them, one per message,
  stored in one append.
* :class:`SendCheck`: ask a live producer of the group about this transaction; report back whether it went out.
* :class:`Discard`: give up asking: copy the half message to TRANS_CHECK_MAX_TIME_TOPIC, then write a DISCARD marker.
* :class:`AppendJournal`: append this line to the check journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txmq._hotpath import reduce_by_fields
from txmq.protocol.record import MessageRecord
from txmq.txn.history import TransactionRecord
from txmq.txn.model import By, Decision


@dataclass(slots=True, init=False)
class DecisionRequest:
    """A COMMIT or ROLLBACK about one half message, from any door (END_TRANSACTION, gRPC EndTransaction, an
    operator), with what the request says the half message is."""

    phys: int  # the half message's commit-log offset
    decision: Decision
    by: By
    group: str  # the producer group the request names
    queue_offset: int  # the half queue offset it names (tranStateTableOffset)
    msg_id: str  # how the request names the message (for logs and remarks)
    transaction_id: str | None = None
    origin: Any = None  # who sent it (a peer address), for logs
    messages: int | None = None  # how many messages the producer put in the transaction, when it says

    # The __init__ of the objects made once per decision is written out: mypyc compiles it, while a dataclass's
    # generated __init__ runs interpreted. tests/protocol/test_constructors.py holds each to its fields.
    def __init__(
        self,
        phys: int,
        decision: Decision,
        by: By,
        group: str,
        queue_offset: int,
        msg_id: str,
        transaction_id: str | None = None,
        origin: Any = None,
        messages: int | None = None,
    ) -> None:
        self.phys = phys
        self.decision = decision
        self.by = by
        self.group = group
        self.queue_offset = queue_offset
        self.msg_id = msg_id
        self.transaction_id = transaction_id
        self.origin = origin
        self.messages = messages

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)


@dataclass(slots=True)
class Reply:
    code: int
    remark: str | None
    warning: str | None = None


@dataclass(slots=True, init=False)
class StoreDecision:
    phys: int
    queue_offset: int
    uniq_key: str | None
    decision: Decision
    by: By
    half: MessageRecord | None  # None for the other messages of a transaction of several: the driver reads them
    rec: TransactionRecord | None  # the record, when one exists (else the transaction is fresh)
    msg_id: str
    group: str

    def __init__(
        self,
        phys: int,
        queue_offset: int,
        uniq_key: str | None,
        decision: Decision,
        by: By,
        half: MessageRecord | None,
        rec: TransactionRecord | None,
        msg_id: str,
        group: str,
    ) -> None:
        self.phys = phys
        self.queue_offset = queue_offset
        self.uniq_key = uniq_key
        self.decision = decision
        self.by = by
        self.half = half
        self.rec = rec
        self.msg_id = msg_id
        self.group = group

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)


@dataclass(slots=True)
class SendCheck:
    rec: TransactionRecord


@dataclass(slots=True)
class Discard:
    rec: TransactionRecord


@dataclass(slots=True)
class AppendJournal:
    line: str


Due = SendCheck | Discard
