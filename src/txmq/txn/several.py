"""Several messages in one transaction: the rules that are theirs alone (docs/transactions.md, "Several messages in
one transaction"). Each message is a half message carrying ``TXMQ_TX_ID`` (the transaction id) and ``TXMQ_TX_SEQ``
(its place); the table holds the messages of one in-doubt transaction together, in order, and decides, checks and
discards them through the first. No IO.
"""

from __future__ import annotations

from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import MessageRecord, Prop
from txmq.txn.effects import DecisionRequest, Reply, StoreDecision
from txmq.txn.history import TransactionRecord
from txmq.txn.model import Decision


def join_refusal(half: MessageRecord, tx_id: str, members: list[TransactionRecord] | None, limit: int) -> str | None:
    """Why ``half`` may not join transaction ``tx_id`` (whose messages in doubt here are ``members``), or None: the
    transaction is full, its first message is not on this broker, or this place is taken."""
    props = half.properties
    try:
        seq = int(props.get(Prop.TX_SEQ, ""))
    except ValueError:
        return f"[TXMQ] {Prop.TX_SEQ}={props.get(Prop.TX_SEQ)!r} of transaction {tx_id} is not a number"
    if members is None:
        if seq != 0:
            return (
                f"[TXMQ] transaction {tx_id} is not open on this broker: its first message ({Prop.TX_SEQ}=0) "
                "must be stored here first, and all its messages on the same broker"
            )
        return None
    if len(members) >= limit:
        return (
            f"[TXMQ] transaction {tx_id} already holds {len(members)} messages, the most one transaction may "
            f"hold (transactionMaxMessages={limit}); nothing of this message was stored"
        )
    if any(m.seq == seq for m in members):
        return f"[TXMQ] message {seq} of transaction {tx_id} is already stored"
    return None


def decisions_of_several(
    req: DecisionRequest, half: MessageRecord, tx_id: str, members: list[TransactionRecord] | None
) -> Reply | list[StoreDecision]:
    """One decision per message of transaction ``tx_id`` (``members``, in order), when ``req`` names its first
    message and, for a COMMIT, counts as many messages as the broker holds; else the refusal."""
    if not members or members[0].phys != req.phys:
        first = f" (commitLogOffset {members[0].phys})" if members else ""
        return Reply(
            ResponseCode.SYSTEM_ERROR,
            f"[TXMQ] transaction {tx_id} holds several messages: it is decided through its first{first}; "
            "nothing decided",
        )
    if req.messages is not None and req.messages != len(members) and req.decision == Decision.COMMIT:
        return Reply(
            ResponseCode.SYSTEM_ERROR,
            f"[TXMQ] transaction {tx_id}: the producer sent {req.messages} messages, the broker holds "
            f"{len(members)} of them; COMMIT refused, nothing decided",
        )
    return [
        StoreDecision(
            rec.phys,
            rec.queue_offset,
            rec.uniq_key,
            req.decision,
            req.by,
            half if rec.phys == req.phys else None,
            rec,
            req.msg_id,
            req.group,
        )
        for rec in members
    ]
