"""The check journal's format: lines written, parsed back, torn and malformed lines, the legacy file."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.txn.journal import CheckAttempt, journal_lines, parse_journal, parse_legacy_checks

answers = st.sampled_from(["COMMIT", "ROLLBACK", "UNKNOWN"])
attempt = st.builds(
    CheckAttempt,
    st.integers(0, 2**45),
    st.one_of(st.none(), answers),
    st.integers(0, 2**45),
).map(lambda a: a if a.answer is not None else CheckAttempt(a.sent_ms))
histories = st.dictionaries(st.integers(0, 2**50), st.lists(attempt, max_size=6), max_size=8)


@given(histories)
def test_what_is_written_is_read_back(history: dict[int, list[CheckAttempt]]) -> None:
    # An answer pairs with the latest unanswered check, and lines are written check then answer, so every
    # history reads back as it was (a half message with no checks writes nothing).
    history = {h: a for h, a in history.items() if a}
    journal = parse_journal("".join(journal_lines(history.items())).encode())
    assert journal.attempts == history and journal.bad == 0


def test_a_torn_last_line_and_malformed_lines_are_skipped() -> None:
    data = b"C 10 1000\nA 10 1500 COMMIT\nX nonsense\nC abc 1\nA 99 1 COMMIT\nC 20 2000\nC 20 30"
    journal = parse_journal(data)
    assert journal.attempts == {10: [CheckAttempt(1000, "COMMIT", 1500)], 20: [CheckAttempt(2000)]}
    assert journal.bad == 2 and journal.lines == 6  # the torn "C 20 30" is not a line; "A 99" answers nothing


def test_an_answer_pairs_with_the_latest_unanswered_check() -> None:
    journal = parse_journal(b"C 5 1\nC 5 2\nA 5 3 UNKNOWN\nA 5 4 COMMIT\n")
    assert journal.attempts[5] == [CheckAttempt(1, "COMMIT", 4), CheckAttempt(2, "UNKNOWN", 3)]


def test_legacy_check_counts() -> None:
    assert parse_legacy_checks(b'{"checks": {"7": [2, 900]}}') == {7: [CheckAttempt(900), CheckAttempt(900)]}
    with pytest.raises(ValueError):
        parse_legacy_checks(b'{"checks": {"7": 3}}')
    with pytest.raises(ValueError):
        parse_legacy_checks(b"not json")
