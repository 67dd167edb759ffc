"""How a transaction ended, folded from its op-topic records in log order: one fold for the broker's start-up and
the Spark audit.

Each op-topic record about a half message is an :class:`OpEvent` (a decision or a DISCARD in an op marker, or an
operator's resume). :func:`fold` replays them through the transaction table (:mod:`txmq.txn.machine`), so the rules
that decided them live decide them again: the first decision wins, DISCARD is not a decision, only a discarded
transaction can be resumed. What the events cannot say is supplied by the caller: whether a committed copy exists,
for a marker written by Apache RocketMQ, which records no decision (``UNKNOWN``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from txmq.txn.machine import IllegalTransactionTransition, Verdict, rule
from txmq.txn.model import INPUT_OF_DECISION, By, Decision, Input, TxState, state_after

UNKNOWN = "UNKNOWN"  # a marker written by RocketMQ: ended, committed when a committed copy exists
RESUME = "RESUME"
_KNOWN = frozenset({Decision.COMMIT, Decision.ROLLBACK, Decision.DISCARD, RESUME, UNKNOWN})


@dataclass(frozen=True, slots=True)
class OpEvent:
    """One op-topic record about a half message."""

    seq: int  # its place in the op log (queue offset, or commit-log offset): events fold in this order
    action: str  # COMMIT, ROLLBACK, DISCARD, UNKNOWN, or RESUME
    at: int  # when (the record's born time, ms)
    by: str | None = None  # TXMQ_BY, when the marker carries it
    copy_msg_id: str | None = None  # TXMQ_COPY_MSG_ID: the delivered (or discarded) copy's offsetMsgId


@dataclass(slots=True)
class Folded:
    """Where a transaction's op records leave it."""

    decision: OpEvent | None = None  # the COMMIT, ROLLBACK or UNKNOWN in force, or the DISCARD while discarded
    discard: OpEvent | None = None  # the latest DISCARD, kept after a resume (its history shows it)
    resumes: list[int] = field(default_factory=list)

    def state(self, *, delivered: bool = False) -> TxState:
        """The transaction's state; ``delivered``: a committed copy exists (decides an UNKNOWN marker)."""
        action = self.decision.action if self.decision else None
        if action == UNKNOWN:
            return TxState.COMMITTED if delivered else TxState.ROLLED_BACK
        return state_after(action)


def fold(folded: Folded, event: OpEvent) -> Folded:
    """``folded`` after ``event`` (changed in place and returned). An event the table does not apply in the current
    state (a second decision, a resume of a transaction that is not discarded) changes nothing."""
    if folded.decision is not None and folded.decision.action == UNKNOWN:
        return folded  # ended without saying how: as final as a decision
    if event.action not in _KNOWN:
        event = dataclasses.replace(event, action=UNKNOWN)  # a marker whose decision cannot be read still ended it
    current = folded.state()
    if event.action == RESUME:
        step, by = Input.RESUME, By.OPERATOR
    elif event.action == UNKNOWN:
        if current in (TxState.PREPARED, TxState.DISCARDED):
            folded.decision = event
        return folded
    else:
        # A decision on disk was taken by someone the table let decide; who it was matters for what the broker answers
        # (REPEAT or REFUSE), never for what is stored, so the replay asks as the producer.
        step = INPUT_OF_DECISION[event.action]
        by = By.BROKER if step is Input.DISCARD else By.PRODUCER
    try:
        found = rule(current, step, by)
    except IllegalTransactionTransition:
        return folded
    if found.verdict is not Verdict.APPLY:
        return folded
    if step is Input.RESUME:
        folded.decision = None
        folded.resumes.append(event.at)
    else:
        folded.decision = event
        if step is Input.DISCARD:
            folded.discard = event
    return folded


def fold_all(events: Iterable[OpEvent]) -> Folded:
    """The fold of one transaction's events, taken in log order whatever order they come in."""
    folded = Folded()
    for event in sorted(events, key=lambda e: e.seq):
        fold(folded, event)
    return folded
