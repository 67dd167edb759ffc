"""The words of the transaction core: states, decisions, who decided, and the inputs the machine takes.

``Decision`` and ``By`` are string enums whose values are what op markers and the wire carry (``TXMQ_DECISION``,
``TXMQ_BY``), so a member compares equal to the string read from disk.
"""

from __future__ import annotations

import enum


class TxState(enum.Enum):
    """A transaction's state on the broker."""

    PREPARED = "PREPARED"  # half message stored, no decision: pending, checked on schedule
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"  # transactionCheckMax reached: copied to TRANS_CHECK_MAX_TIME_TOPIC, not checked

    # Members are singletons compared by identity: hash them by identity too, in C. Enum's own __hash__ is Python
    # code, run on every set or dict lookup of a state (several per transaction).
    __hash__ = object.__hash__


class Decision(enum.StrEnum):
    """What an op marker records for a half message (``TXMQ_DECISION``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    DISCARD = "DISCARD"  # not a decision: the check limit was reached; a later COMMIT or ROLLBACK still applies


class By(enum.StrEnum):
    """Who ended (or re-opened) a transaction (``TXMQ_BY`` on the op marker)."""

    PRODUCER = "producer"  # END_TRANSACTION from the producer after its local transaction
    CHECK = "check"  # END_TRANSACTION answering a check (fromTransactionCheck=true)
    OPERATOR = "operator"  # txmq admin tx resolve / resume
    BROKER = "broker"  # DISCARD after transactionCheckMax checks or fileReservedTime
    RECOVERY = "recovery"  # a commit whose op marker was lost in a crash, found again at start


class Input(enum.Enum):
    """What can happen to a transaction: the machine's inputs besides who brings them."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    DISCARD = "DISCARD"
    RESUME = "RESUME"

    __hash__ = object.__hash__


STATE_OF_DECISION: dict[str, TxState] = {
    Decision.COMMIT: TxState.COMMITTED,
    Decision.ROLLBACK: TxState.ROLLED_BACK,
    Decision.DISCARD: TxState.DISCARDED,
}
DECISION_OF_STATE: dict[TxState, Decision] = {
    TxState.COMMITTED: Decision.COMMIT,
    TxState.ROLLED_BACK: Decision.ROLLBACK,
    TxState.DISCARDED: Decision.DISCARD,
}
INPUT_OF_DECISION: dict[str, Input] = {
    Decision.COMMIT: Input.COMMIT,
    Decision.ROLLBACK: Input.ROLLBACK,
    Decision.DISCARD: Input.DISCARD,
}
RESOLVED = frozenset({TxState.COMMITTED, TxState.ROLLED_BACK})


def state_after(decision: str | None) -> TxState:
    """The state a half message is in, given the decision recorded for it (None: none yet)."""
    return TxState.PREPARED if decision is None else STATE_OF_DECISION[decision]
