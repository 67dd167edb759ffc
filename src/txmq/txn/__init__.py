"""The transaction core, with no IO: its words (:mod:`.model`), the rules as a table (:mod:`.machine`) and the check
journal's format (:mod:`.journal`). Like :mod:`txmq.protocol`, it imports only ``txmq.protocol`` and ``txmq.errors``;
the broker's driver (``txmq.broker.txn``) carries out what it decides.
"""

from txmq.txn.machine import (
    TRANSITIONS,
    TX_TRANSITIONS,
    IllegalTransactionTransition,
    Rule,
    Verdict,
    next_state,
    rule,
)
from txmq.txn.model import DECISION_OF_STATE, RESOLVED, STATE_OF_DECISION, By, Decision, Input, TxState, state_after

__all__ = [
    "DECISION_OF_STATE",
    "RESOLVED",
    "STATE_OF_DECISION",
    "TRANSITIONS",
    "TX_TRANSITIONS",
    "By",
    "Decision",
    "IllegalTransactionTransition",
    "Input",
    "Rule",
    "TxState",
    "Verdict",
    "next_state",
    "rule",
    "state_after",
]
