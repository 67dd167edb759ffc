"""The transaction table against the one docs/transactions.md prints, for every (state, input, who)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.protocol.codes import ResponseCode
from txmq.txn import TX_TRANSITIONS, By, IllegalTransactionTransition, Input, TxState, Verdict, next_state, rule

DOC = Path(__file__).resolve().parents[2] / "docs" / "transactions.md"
_ROW = re.compile(r"^\| (\w+) \| (\w+) \| ([\w, ]+) \| (.+?) \|$")


def documented() -> dict[tuple[TxState, Input, By], str]:
    """The rows of the table under "### States", expanded to one entry per (state, input, who)."""
    text = DOC.read_text()
    section = text[text.index("### States") : text.index("### History in memory")]
    table: dict[tuple[TxState, Input, By], str] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is None or match.group(1) == "State":
            continue
        state, event, who, what = match.groups()
        for by in who.split(", "):
            key = (TxState[state], Input[event], By(by))
            assert key not in table, f"{key} is in the documented table twice"
            table[key] = what
    assert table, "no table found under '### States' in docs/transactions.md"
    return table


DOCUMENTED = documented()


def described(state: TxState, event: Input, by: By) -> str:
    """What the code's table says, in the documentation's words; "illegal" when it has no row."""
    try:
        found = rule(state, event, by)
    except IllegalTransactionTransition:
        return "illegal"
    if found.verdict is Verdict.APPLY:
        assert found.target is not None
        return f"apply → {found.target.value}"
    if found.verdict is Verdict.REPEAT:
        assert found.code == ResponseCode.SUCCESS
        return "repeat (SUCCESS, nothing done)"
    return f"refuse ({ResponseCode(found.code).name})"


@pytest.mark.parametrize(("state", "event", "by"), list(itertools.product(TxState, Input, By)))
def test_every_state_input_and_who_is_as_documented(state: TxState, event: Input, by: By) -> None:
    assert described(state, event, by) == DOCUMENTED.get((state, event, by), "illegal")


@given(st.sampled_from(TxState), st.sampled_from(Input), st.sampled_from(By))
def test_rules_agree_with_the_state_transitions(state: TxState, event: Input, by: By) -> None:
    """An applied input moves along an allowed transition; nothing else changes state."""
    try:
        found = rule(state, event, by)
    except IllegalTransactionTransition as exc:
        assert state.value in str(exc) and event.value in str(exc) and by.value in str(exc)
        return
    if found.verdict is Verdict.APPLY:
        assert found.target is not None and next_state(state, found.target) is found.target
    else:
        assert (found.target is None and found.code != ResponseCode.SUCCESS) or found.verdict is Verdict.REPEAT


def test_final_states_and_the_first_decision_wins() -> None:
    assert TX_TRANSITIONS[TxState.COMMITTED] == frozenset() == TX_TRANSITIONS[TxState.ROLLED_BACK]
    for ended, same, other in (
        (TxState.COMMITTED, Input.COMMIT, Input.ROLLBACK),
        (TxState.ROLLED_BACK, Input.ROLLBACK, Input.COMMIT),
    ):
        for by in (By.PRODUCER, By.CHECK):
            assert rule(ended, same, by).verdict is Verdict.REPEAT
            assert rule(ended, other, by).verdict is Verdict.REFUSE
    with pytest.raises(IllegalTransactionTransition):
        next_state(TxState.COMMITTED, TxState.PREPARED)
