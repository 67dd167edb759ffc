"""The fold of a transaction's op records: what the broker's start-up and the Spark audit both use."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from txmq.txn import TxState
from txmq.txn.rebuild import RESUME, UNKNOWN, OpEvent, fold_all

actions = st.sampled_from(["COMMIT", "ROLLBACK", "DISCARD", UNKNOWN, RESUME])


def reference(sequence: list[str]) -> str | None:
    """The rules in their plainest form: the first decision wins, DISCARD is not one, a resume re-opens a discard."""
    state: str | None = None
    for action in sequence:
        if (action in ("COMMIT", "ROLLBACK", UNKNOWN) and state in (None, "DISCARD")) or (
            action == "DISCARD" and state is None
        ):
            state = action
        elif action == RESUME and state == "DISCARD":
            state = None
    return state


@given(st.lists(actions, max_size=12), st.randoms())
def test_the_fold_follows_the_rules_in_log_order(sequence: list[str], rnd) -> None:
    events = [OpEvent(seq, action, 1000 + seq) for seq, action in enumerate(sequence)]
    rnd.shuffle(events)  # they may come in any order; the fold takes them in log order
    folded = fold_all(events)
    expected = reference(sequence)
    assert (folded.decision.action if folded.decision else None) == expected
    assert folded.resumes == [
        1000 + i for i, a in enumerate(sequence) if a == RESUME and reference(sequence[:i]) == "DISCARD"
    ]
    discards = [i for i, a in enumerate(sequence) if a == "DISCARD" and reference(sequence[:i]) is None]
    assert (folded.discard.seq if folded.discard else None) == (discards[-1] if discards else None)


def test_states_and_the_unknown_marker() -> None:
    assert fold_all([]).state() is TxState.PREPARED
    assert fold_all([OpEvent(1, "DISCARD", 5)]).state() is TxState.DISCARDED
    assert fold_all([OpEvent(1, "DISCARD", 5), OpEvent(2, RESUME, 6)]).state() is TxState.PREPARED
    unknown = fold_all([OpEvent(1, UNKNOWN, 5), OpEvent(2, "ROLLBACK", 6)])
    assert unknown.decision is not None and unknown.decision.at == 5  # the later ROLLBACK changes nothing
    assert unknown.state(delivered=True) is TxState.COMMITTED and unknown.state() is TxState.ROLLED_BACK
    late = fold_all([OpEvent(1, "DISCARD", 5), OpEvent(2, "COMMIT", 9, "producer", "ID")])
    assert late.state() is TxState.COMMITTED and late.discard is not None and late.decision.copy_msg_id == "ID"


def test_a_decision_that_cannot_be_read_ends_the_transaction_like_a_rocketmq_marker() -> None:
    """A corrupt TXMQ_DECISION (or none, in a Spark row) must not stop a start-up: it counts as ended, unknown how."""
    for garbage in ("FOO", "None", ""):
        folded = fold_all([OpEvent(1, garbage, 5), OpEvent(2, "COMMIT", 6)])
        assert folded.decision is not None and folded.decision.action == UNKNOWN and folded.decision.at == 5
        assert folded.state() is TxState.ROLLED_BACK and folded.state(delivered=True) is TxState.COMMITTED
