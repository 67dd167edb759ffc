"""The transaction state machine as data: (state, input, who) -> what happens.

Every rule the broker applies to a transaction lives in :data:`TRANSITIONS`: the first decision wins, a repeated
identical decision is answered SUCCESS and does nothing, a conflicting one is refused, DISCARD is not a decision (a
late COMMIT or ROLLBACK still applies), only a DISCARDED transaction can be resumed, and an operator is told when
anything else already ended the transaction. A key that is not in the table is an input that cannot happen in that
state; :func:`rule` raises :class:`IllegalTransactionTransition` for it. ``docs/transactions.md`` (section "States")
prints the same table, and a test holds the two together.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from txmq.errors import TxmqError
from txmq.protocol.codes import ResponseCode
from txmq.txn.model import By, Input, TxState


class IllegalTransactionTransition(TxmqError):
    """An input that the transaction table does not allow in the transaction's state."""


class Verdict(enum.Enum):
    APPLY = "apply"  # carry the input out: the transaction moves to ``target``
    REPEAT = "repeat"  # the same decision again: answered SUCCESS, nothing is done (never a second delivery)
    REFUSE = "refuse"  # answered with ``code``; nothing changes

    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class Rule:
    verdict: Verdict
    target: TxState | None = None  # APPLY only
    code: int = ResponseCode.SUCCESS  # REPEAT and REFUSE: the response code


_DECIDERS = (By.PRODUCER, By.CHECK, By.OPERATOR)
_DECISIONS = {Input.COMMIT: TxState.COMMITTED, Input.ROLLBACK: TxState.ROLLED_BACK}


def _table() -> dict[tuple[TxState, Input, By], Rule]:
    table: dict[tuple[TxState, Input, By], Rule] = {}
    for decision, decided in _DECISIONS.items():
        for by in _DECIDERS:
            # An open transaction takes the decision; DISCARD was not a decision, so a discarded one does too.
            table[TxState.PREPARED, decision, by] = Rule(Verdict.APPLY, decided)
            table[TxState.DISCARDED, decision, by] = Rule(Verdict.APPLY, decided)
            for ended in _DECISIONS.values():
                if by is By.OPERATOR:
                    # An operator is told who ended it first, whatever the operator asked for.
                    table[ended, decision, by] = Rule(Verdict.REFUSE, code=ResponseCode.TRANSACTION_FAILED)
                elif ended is decided:
                    table[ended, decision, by] = Rule(Verdict.REPEAT)
                else:
                    table[ended, decision, by] = Rule(Verdict.REFUSE, code=ResponseCode.SYSTEM_ERROR)
    # At start, a committed copy whose op marker was lost commits its half message again (marker only).
    table[TxState.PREPARED, Input.COMMIT, By.RECOVERY] = Rule(Verdict.APPLY, TxState.COMMITTED)
    # transactionCheckMax checks, or older than fileReservedTime: the broker gives up asking.
    table[TxState.PREPARED, Input.DISCARD, By.BROKER] = Rule(Verdict.APPLY, TxState.DISCARDED)
    # An operator re-opens a discarded transaction; anything else cannot be resumed.
    for state in TxState:
        if state is TxState.DISCARDED:
            table[state, Input.RESUME, By.OPERATOR] = Rule(Verdict.APPLY, TxState.PREPARED)
        else:
            table[state, Input.RESUME, By.OPERATOR] = Rule(Verdict.REFUSE, code=ResponseCode.TRANSACTION_FAILED)
    return table


TRANSITIONS: dict[tuple[TxState, Input, By], Rule] = _table()

# The states each state may move to (the APPLY rules), for checking a change that is already on disk.
TX_TRANSITIONS: dict[TxState, frozenset[TxState]] = {
    state: frozenset(
        r.target for (s, _i, _b), r in TRANSITIONS.items() if s is state and r.verdict is Verdict.APPLY and r.target
    )
    for state in TxState
}


def rule(state: TxState, event: Input, by: By) -> Rule:
    """What the table says for ``event`` brought by ``by`` to a transaction in ``state``."""
    found = TRANSITIONS.get((state, event, by))
    if found is None:
        raise IllegalTransactionTransition(f"{event.value} by {by.value} cannot happen to a {state.value} transaction")
    return found


def next_state(state: TxState, new: TxState) -> TxState:
    """``new`` when some input moves ``state`` to it, else :class:`IllegalTransactionTransition`."""
    if new not in TX_TRANSITIONS[state]:
        raise IllegalTransactionTransition(f"a {state.value} transaction cannot become {new.value}")
    return new
